#include "agent/kernel/kernel_symbols.h"

#include <cstring>
#include <fstream>

#include "gtest/gtest.h"

namespace strata::agent::kernel {
namespace {

constexpr char kKallsyms[] =
    "ffffffff81000000 T _text\n"
    "ffffffff81000000 T startup_64\n"
    "ffffffff81001000 t do_one_initcall\n"
    "ffffffff81002000 D some_data\n"
    "ffffffff81003000 T __x64_sys_read\n"
    "ffffffff81004000 W weak_data\n"
    "ffffffffc0001000 t xfs_file_read_iter\t[xfs]\n"
    "ffffffffc0000800 T xfs_init\t[xfs]\n"
    "ffffffffc0100000 t nft_do_chain\t[nf_tables]\n";

TEST(KernelSymbolsTest, LooksUpTheClosestTextSymbolBelow) {
  auto symbols = KernelSymbols::Parse(kKallsyms);
  ASSERT_TRUE(symbols.ok()) << symbols.status();
  EXPECT_EQ((*symbols)->size(), 7u);  // t and T only
  KernelSymbol s;
  ASSERT_TRUE((*symbols)->Lookup(0xffffffff81003010, &s));
  EXPECT_EQ(s.name, "__x64_sys_read");
  EXPECT_EQ(s.module, "");
  EXPECT_EQ(s.offset, 0x3000u);
  // Data symbols do not end the function before them.
  ASSERT_TRUE((*symbols)->Lookup(0xffffffff81002500, &s));
  EXPECT_EQ(s.name, "do_one_initcall");
  ASSERT_TRUE((*symbols)->Lookup(0xffffffffc0001004, &s));
  EXPECT_EQ(s.name, "xfs_file_read_iter");
  EXPECT_EQ(s.module, "xfs");
  EXPECT_EQ(s.offset, 0x800u);  // from the module's lowest text symbol, xfs_init
  ASSERT_TRUE((*symbols)->Lookup(0xffffffffc0100000, &s));
  EXPECT_EQ(s.module, "nf_tables");
  EXPECT_EQ(s.offset, 0u);
  EXPECT_FALSE((*symbols)->Lookup(0xffffffff80000000, &s));
}

TEST(KernelSymbolsTest, HiddenAddressesAreAClearError) {
  auto symbols = KernelSymbols::Parse("0000000000000000 T _text\n0000000000000000 t foo\n");
  EXPECT_TRUE(absl::IsFailedPrecondition(symbols.status())) << symbols.status();
  EXPECT_NE(symbols.status().message().find("kptr_restrict"), std::string_view::npos);
}

TEST(KernelSymbolsTest, MalformedLinesAreRejected) {
  for (const char* bad : {"zzzz T foo\n", "ffffffff81000000 T\n", "ffffffff81000000 Tfoo\n",
                          "ffffffff81000000 t foo\txfs]\n"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(KernelSymbols::Parse(bad).status())) << bad;
  }
}

TEST(KernelSymbolsTest, BuildIdFromElfNotes) {
  std::string notes;
  auto note = [&notes](uint32_t type, std::string_view name, std::string_view desc) {
    uint32_t header[3] = {static_cast<uint32_t>(name.size()), static_cast<uint32_t>(desc.size()),
                          type};
    notes.append(reinterpret_cast<const char*>(header), sizeof(header));
    notes.append(name);
    notes.resize((notes.size() + 3) & ~size_t{3}, '\0');
    notes.append(desc);
    notes.resize((notes.size() + 3) & ~size_t{3}, '\0');
  };
  note(6, std::string_view("Xen\0", 4), "abc");
  note(3, std::string_view("GNU\0", 4), "\x01\x02\x03\x04\x05");
  EXPECT_EQ(BuildIdFromNotes(notes), "\x01\x02\x03\x04\x05");
  EXPECT_EQ(BuildIdFromNotes(notes.substr(0, 20)), "");
  EXPECT_EQ(BuildIdFromNotes(""), "");
}

// The running kernel, where this process may read its addresses.
TEST(KernelSymbolsTest, RunningKernel) {
  auto symbols = KernelSymbols::Load();
  if (!symbols.ok()) GTEST_SKIP() << "kernel symbols not readable here: " << symbols.status();
  EXPECT_GT((*symbols)->size(), 1000u);
  std::ifstream in("/proc/kallsyms");
  std::string address, type, name;
  bool checked = false;
  while (in >> address >> type >> name) {
    if (name != "schedule" || (type != "T" && type != "t")) continue;
    KernelSymbol s;
    ASSERT_TRUE((*symbols)->Lookup(std::stoull(address, nullptr, 16) + 1, &s));
    EXPECT_EQ(s.name, "schedule");
    checked = true;
    break;
  }
  EXPECT_TRUE(checked);
}

}  // namespace
}  // namespace strata::agent::kernel
