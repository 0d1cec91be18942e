#include "common/elf/debug_file.h"

#include <lzma.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/elf/debug_fixtures_for_test.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::elf {
namespace {

using testing::Fixture;
using testing::FunctionStart;
using testing::kExportedFunction;
using testing::kLocalFunction;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;
using ::testing::HasSubstr;

std::unique_ptr<ElfFile> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::Open(path);
  EXPECT_TRUE(elf.ok()) << elf.status();
  return elf.ok() ? *std::move(elf) : nullptr;
}

std::string Xz(std::string_view data) {
  std::string out(lzma_stream_buffer_bound(data.size()), '\0');
  size_t pos = 0;
  lzma_ret ret = lzma_easy_buffer_encode(
      6, LZMA_CHECK_CRC64, nullptr, reinterpret_cast<const uint8_t*>(data.data()), data.size(),
      reinterpret_cast<uint8_t*>(out.data()), &pos, out.size());
  EXPECT_EQ(ret, LZMA_OK);
  out.resize(pos);
  return out;
}

TEST(DebugFileTest, BuildIdDebugPath) {
  EXPECT_EQ(BuildIdDebugPath("/usr/lib/debug", "abcdef0123"),
            "/usr/lib/debug/.build-id/ab/cdef0123.debug");
  EXPECT_EQ(BuildIdDebugPath("/proc/7/root/usr/lib/debug/", "abc"),
            "/proc/7/root/usr/lib/debug/.build-id/ab/c.debug");
  EXPECT_EQ(BuildIdDebugPath("/usr/lib/debug", "ab"), "");
  EXPECT_EQ(BuildIdDebugPath("/usr/lib/debug", ""), "");
  EXPECT_EQ(BuildIdDebugPath("/usr/lib/debug", "ab/../../etc"), "");
}

TEST(DebugFileTest, RootOf) {
  EXPECT_EQ(RootOf("/proc/42/root/usr/lib/libc.so.6", "/usr/lib/libc.so.6"), "/proc/42/root");
  EXPECT_EQ(RootOf("/usr/lib/libc.so.6", "/usr/lib/libc.so.6"), "");
  EXPECT_EQ(RootOf("/proc/42/map_files/1000-2000", "/usr/lib/libc.so.6"), "");
  EXPECT_EQ(RootOf("/proc/42/root/x", "x"), "");
}

TEST(DebugFileTest, Crc32IsZlibs) {
  EXPECT_EQ(Crc32("123456789"), 0xcbf43926u);
  EXPECT_EQ(Crc32("56789", Crc32("1234")), 0xcbf43926u);
  EXPECT_EQ(Crc32(""), 0u);
}

TEST(DebugFileTest, DecompressXzBoundsAndErrors) {
  const std::string big(1 << 20, 'z');
  const std::string xz = Xz(big);
  ASSERT_LT(xz.size(), 4096u);
  absl::StatusOr<std::string> out = DecompressXz(xz, big.size());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, big);

  out = DecompressXz(xz, big.size() - 1);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  out = DecompressXz("definitely not xz", 1 << 20);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  out = DecompressXz(xz.substr(0, xz.size() / 2), 1 << 21);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("truncated"));
  std::string corrupt = xz;
  for (size_t i = 24; i < 40 && i < corrupt.size(); ++i) corrupt[i] ^= 0x5a;
  out = DecompressXz(corrupt, 1 << 21);
  EXPECT_FALSE(out.ok());
  out = DecompressXz("", 100);
  EXPECT_FALSE(out.ok());
  // Every prefix and every single flipped byte: an error or the data, never a crash.
  const std::string small = Xz("a short MiniDebugInfo stand-in");
  for (size_t i = 0; i < small.size(); ++i) {
    (void)DecompressXz(small.substr(0, i), 1 << 16);
    std::string flipped = small;
    flipped[i] ^= 0xff;
    (void)DecompressXz(flipped, 1 << 16);
  }
}

class DebugFileFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::FixturesDir().empty()) {
      GTEST_SKIP() << "debug fixtures not built (needs xz, objcopy, strip and nm at configure time)";
    }
    full_ = OpenOrDie(Fixture("full.so"));
    ASSERT_NE(full_, nullptr);
    local_ = FunctionStart(*full_, kLocalFunction);
    ASSERT_NE(local_, 0u);
  }
  std::unique_ptr<ElfFile> full_;
  uint64_t local_ = 0;
};

TEST_F(DebugFileFixtureTest, DebugFilesOpenAndKeepTheirFunctionSymbols) {
  std::unique_ptr<ElfFile> debug = OpenOrDie(Fixture("stripped.debug"));
  ASSERT_NE(debug, nullptr);
  const Section* text = debug->FindSection(".text");
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->type, 8u) << "SHT_NOBITS";
  EXPECT_EQ(debug->build_id(), full_->build_id());
  EXPECT_EQ(FunctionStart(*debug, kLocalFunction), local_);
  EXPECT_NE(FunctionStart(*debug, kExportedFunction), 0u);

  std::unique_ptr<ElfFile> stripped = OpenOrDie(Fixture("stripped.so"));
  ASSERT_NE(stripped, nullptr);
  EXPECT_EQ(FunctionStart(*stripped, kLocalFunction), 0u);
  EXPECT_NE(FunctionStart(*stripped, kExportedFunction), 0u) << ".dynsym survives strip";
}

TEST_F(DebugFileFixtureTest, ReadDebugLink) {
  std::unique_ptr<ElfFile> nobid = OpenOrDie(Fixture("nobid.so"));
  ASSERT_NE(nobid, nullptr);
  EXPECT_TRUE(nobid->build_id().empty());
  std::optional<DebugLink> link = ReadDebugLink(*nobid);
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->name, "nobid.so.debug");
  EXPECT_EQ(link->crc, Crc32(ReadFile(Fixture("nobid.so.debug"))));
  EXPECT_FALSE(ReadDebugLink(*full_).has_value());

  const std::string bytes = ReadFile(Fixture("nobid.so"));
  auto link_of = [&](auto edit) -> std::optional<DebugLink> {
    std::string edited = testing::EditSection(bytes, ".gnu_debuglink", edit);
    absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::FromBytes(edited);
    EXPECT_TRUE(elf.ok());
    return elf.ok() ? ReadDebugLink(**elf) : std::nullopt;
  };
  EXPECT_FALSE(link_of([](std::string& d) { d.assign(d.size(), 'a'); }).has_value()) << "no NUL";
  EXPECT_FALSE(link_of([](std::string& d) { d.replace(0, 5, "../x\0", 5); }).has_value());
  EXPECT_FALSE(link_of([](std::string& d) { d.assign(d.size(), '\0'); }).has_value()) << "empty";
}

TEST_F(DebugFileFixtureTest, MiniDebugInfoNamesLocalFunctions) {
  std::unique_ptr<ElfFile> mini_so = OpenOrDie(Fixture("mini.so"));
  ASSERT_NE(mini_so, nullptr);
  EXPECT_EQ(FunctionStart(*mini_so, kLocalFunction), 0u);
  absl::StatusOr<std::unique_ptr<ElfFile>> mini = ReadMiniDebugInfo(*mini_so);
  ASSERT_TRUE(mini.ok()) << mini.status();
  EXPECT_EQ(FunctionStart(**mini, kLocalFunction), local_);

  std::unique_ptr<ElfFile> stripped = OpenOrDie(Fixture("stripped.so"));
  ASSERT_NE(stripped, nullptr);
  EXPECT_EQ(ReadMiniDebugInfo(*stripped).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadMiniDebugInfo(*mini_so, 100).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(DebugFileFixtureTest, CorruptMiniDebugInfoIsAnError) {
  const std::string bytes = ReadFile(Fixture("mini.so"));
  struct Case {
    std::string what;
    void (*edit)(std::string&);
    absl::StatusCode code;
  } cases[] = {
      {"flipped bytes", [](std::string& d) { for (size_t i = d.size() / 3; i < d.size() / 2; ++i) d[i] ^= 0x33; },
       absl::StatusCode::kDataLoss},
      {"zeroed tail", [](std::string& d) { std::fill(d.begin() + d.size() / 2, d.end(), '\0'); },
       absl::StatusCode::kDataLoss},
      {"not xz", [](std::string& d) { d.replace(0, 6, "ELFxxx"); }, absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    std::string edited = testing::EditSection(bytes, ".gnu_debugdata", c.edit);
    ASSERT_FALSE(edited.empty());
    absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::FromBytes(edited);
    ASSERT_TRUE(elf.ok()) << elf.status();
    absl::StatusOr<std::unique_ptr<ElfFile>> mini = ReadMiniDebugInfo(**elf);
    EXPECT_EQ(mini.status().code(), c.code) << c.what << ": " << mini.status();
    EXPECT_THAT(std::string(mini.status().message()), HasSubstr(".gnu_debugdata")) << c.what;
  }
  // Valid xz around something that is not ELF (then zeros: xz stream padding when a multiple
  // of 4 bytes, else corrupt).
  const std::string xz = Xz("no ELF here");
  size_t section_size = 0;
  std::string not_elf = testing::EditSection(bytes, ".gnu_debugdata", [&](std::string& d) {
    section_size = d.size();
    d.assign(xz).resize(std::max(section_size, xz.size()), '\0');
  });
  ASSERT_GE(section_size, xz.size());
  absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::FromBytes(not_elf);
  ASSERT_TRUE(elf.ok());
  absl::Status status = ReadMiniDebugInfo(**elf).status();
  EXPECT_EQ(status.code(), (section_size - xz.size()) % 4 == 0 ? absl::StatusCode::kInvalidArgument
                                                               : absl::StatusCode::kDataLoss)
      << status;
}

TEST_F(DebugFileFixtureTest, CandidatesInSearchOrder) {
  std::unique_ptr<ElfFile> stripped = OpenOrDie(Fixture("stripped.so"));
  ASSERT_NE(stripped, nullptr);
  const std::string hex = stripped->BuildIdHex();
  EXPECT_EQ(DebugFileCandidates(*stripped, "/usr/lib/libx.so"),
            std::vector<std::string>{absl::StrCat("/usr/lib/debug/.build-id/", hex.substr(0, 2),
                                                  "/", hex.substr(2), ".debug")});
  std::unique_ptr<ElfFile> nobid = OpenOrDie(Fixture("nobid.so"));
  ASSERT_NE(nobid, nullptr);
  EXPECT_EQ(DebugFileCandidates(*nobid, "/opt/app/lib/libnobid.so"),
            (std::vector<std::string>{"/opt/app/lib/nobid.so.debug",
                                      "/opt/app/lib/.debug/nobid.so.debug",
                                      "/usr/lib/debug/opt/app/lib/nobid.so.debug"}));
  EXPECT_TRUE(DebugFileCandidates(*nobid, "[vdso]").empty());
}

TEST_F(DebugFileFixtureTest, FindsDebugFileByBuildIdUnderTheRoot) {
  TempDir root;
  std::unique_ptr<ElfFile> stripped = OpenOrDie(Fixture("stripped.so"));
  ASSERT_NE(stripped, nullptr);
  const std::string path = BuildIdDebugPath(kDebugDir, stripped->BuildIdHex());
  EXPECT_EQ(OpenDebugFile(*stripped, "/usr/lib/libx.so", root.path()).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteFile(root.path() + path, ReadFile(Fixture("stripped.debug"))));
  absl::StatusOr<DebugFile> debug = OpenDebugFile(*stripped, "/usr/lib/libx.so", root.path());
  ASSERT_TRUE(debug.ok()) << debug.status();
  EXPECT_EQ(debug->path, path);
  EXPECT_EQ(FunctionStart(*debug->elf, kLocalFunction), local_);
}

TEST_F(DebugFileFixtureTest, RejectsDebugFilesOfOtherBuilds) {
  TempDir root;
  std::unique_ptr<ElfFile> stripped = OpenOrDie(Fixture("stripped.so"));
  ASSERT_NE(stripped, nullptr);
  const std::string path = root.path() + BuildIdDebugPath(kDebugDir, stripped->BuildIdHex());
  const std::string debug = ReadFile(Fixture("stripped.debug"));
  std::string other = testing::EditSection(debug, ".note.gnu.build-id",
                                           [](std::string& d) { d.back() ^= 1; });
  ASSERT_FALSE(other.empty());
  struct Case {
    std::string what, bytes, why;
  } cases[] = {
      {"another build ID", other, "build ID"},
      {"no build ID", ReadFile(Fixture("nobid.so.debug")), "build ID none"},
      {"the stripped module itself", ReadFile(Fixture("stripped.so")), "no symbol table"},
      {"not ELF", "garbage", "not an ELF file"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(WriteFile(path, c.bytes));
    absl::StatusOr<DebugFile> found = OpenDebugFile(*stripped, "/usr/lib/libx.so", root.path());
    EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound) << c.what;
    EXPECT_THAT(std::string(found.status().message()), HasSubstr(c.why)) << c.what;
  }
}

TEST_F(DebugFileFixtureTest, FindsDebugLinkInEachPlace) {
  std::unique_ptr<ElfFile> nobid = OpenOrDie(Fixture("nobid.so"));
  ASSERT_NE(nobid, nullptr);
  const std::string debug = ReadFile(Fixture("nobid.so.debug"));
  for (const char* where : {"/opt/app/lib/nobid.so.debug", "/opt/app/lib/.debug/nobid.so.debug",
                            "/usr/lib/debug/opt/app/lib/nobid.so.debug"}) {
    TempDir root;
    ASSERT_TRUE(WriteFile(root.path() + where, debug));
    absl::StatusOr<DebugFile> found = OpenDebugFile(*nobid, "/opt/app/lib/libnobid.so", root.path());
    ASSERT_TRUE(found.ok()) << where << ": " << found.status();
    EXPECT_EQ(found->path, where);
    EXPECT_EQ(FunctionStart(*found->elf, kLocalFunction), FunctionStart(*OpenOrDie(Fixture("nobid_full.so")), kLocalFunction));
  }
}

TEST_F(DebugFileFixtureTest, RejectsDebugLinkWithAnotherCrc) {
  std::unique_ptr<ElfFile> nobid = OpenOrDie(Fixture("nobid.so"));
  ASSERT_NE(nobid, nullptr);
  TempDir root;
  std::string debug = ReadFile(Fixture("nobid.so.debug"));
  debug.push_back('\0');  // still a valid ELF file, another CRC
  ASSERT_TRUE(WriteFile(root.path() + "/opt/app/lib/.debug/nobid.so.debug", debug));
  absl::StatusOr<DebugFile> found = OpenDebugFile(*nobid, "/opt/app/lib/libnobid.so", root.path());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(found.status().message()), HasSubstr("CRC32"));
}

// The real thing: the host's stripped libc and libc6-dbg's debug file.
TEST(DebugFileSystemTest, HostLibcDebugFileNamesLocalFunctions) {
  std::string libc;
  if (std::string missing = testing::SystemLibcDebugFileMissing(&libc); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  std::unique_ptr<ElfFile> elf = OpenOrDie(libc);
  ASSERT_NE(elf, nullptr);
  EXPECT_EQ(FunctionStart(*elf, "start_thread"), 0u);
  absl::StatusOr<DebugFile> debug = OpenDebugFile(*elf, libc, "");
  ASSERT_TRUE(debug.ok()) << debug.status();
  EXPECT_EQ(debug->path, BuildIdDebugPath(kDebugDir, elf->BuildIdHex()));
  EXPECT_NE(FunctionStart(*debug->elf, "start_thread"), 0u);
  EXPECT_NE(FunctionStart(*debug->elf, "__clone3") + FunctionStart(*debug->elf, "clone3"), 0u);
}

}  // namespace
}  // namespace strata::elf
