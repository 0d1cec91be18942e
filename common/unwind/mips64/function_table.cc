#include "common/unwind/mips64/function_table.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <vector>

namespace strata::unwind::mips64 {
namespace {

const CodeRegion* RegionFor(std::span<const CodeRegion> code, uint64_t start, uint64_t end) {
  for (const CodeRegion& r : code) {
    // As offsets into the region: vaddr + size wraps for a region ending at 2^64.
    if (start >= r.vaddr && end >= start && end - r.vaddr <= r.size && r.bytes != nullptr) {
      return &r;
    }
  }
  return nullptr;
}

// The regions whose bytes no region before them (by where their bytes start, then by
// address) has, sorted by address: a file's segments do not share code bytes, and a corrupt
// or hostile one mapping the same bytes at thousands of addresses would have them analyzed,
// and a return-address bitmap built over them, once per address.
std::vector<CodeRegion> DistinctCode(std::span<const CodeRegion> code) {
  std::vector<CodeRegion> regions;
  for (const CodeRegion& r : code) {
    if (r.bytes != nullptr && r.size > 0) regions.push_back(r);
  }
  std::sort(regions.begin(), regions.end(), [](const CodeRegion& a, const CodeRegion& b) {
    return a.bytes != b.bytes ? std::less<const uint8_t*>()(a.bytes, b.bytes) : a.vaddr < b.vaddr;
  });
  std::vector<CodeRegion> distinct;
  for (const CodeRegion& r : regions) {
    if (!distinct.empty() &&
        std::less<const uint8_t*>()(r.bytes, distinct.back().bytes + distinct.back().size)) {
      continue;  // shares bytes with the region before
    }
    distinct.push_back(r);
  }
  std::sort(distinct.begin(), distinct.end(),
            [](const CodeRegion& a, const CodeRegion& b) { return a.vaddr < b.vaddr; });
  return distinct;
}

}  // namespace

std::unique_ptr<PrologueTable> PrologueTable::Build(Arch arch,
                                                    std::vector<FunctionRange> functions,
                                                    std::span<const CodeRegion> all_code) {
  const std::vector<CodeRegion> code = DistinctCode(all_code);
  std::unique_ptr<PrologueTable> t(new PrologueTable());
  t->arch_ = arch;
  const bool be = IsBigEndian(arch);

  // One entry per start, the largest size wins (aliases, weak/strong pairs).
  std::sort(functions.begin(), functions.end(), [](const FunctionRange& a, const FunctionRange& b) {
    return a.start != b.start ? a.start < b.start : a.size > b.size;
  });
  functions.erase(std::unique(functions.begin(), functions.end(),
                              [](const FunctionRange& a, const FunctionRange& b) {
                                return a.start == b.start;
                              }),
                  functions.end());

  std::vector<uint32_t> words;
  for (size_t i = 0; i < functions.size(); ++i) {
    const FunctionRange& fr = functions[i];
    const uint64_t next = i + 1 < functions.size() ? functions[i + 1].start : UINT64_MAX;
    uint64_t end = fr.size ? fr.start + fr.size : next;
    if (end == UINT64_MAX) {  // last function of unknown size: up to the end of its code
      end = fr.start;
      for (const CodeRegion& r : code) {
        if (fr.start >= r.vaddr && fr.start - r.vaddr < r.size) {
          end = r.size > UINT64_MAX - r.vaddr ? UINT64_MAX : r.vaddr + r.size;
        }
      }
    }
    end = std::min(end, next);
    if (end <= fr.start) continue;

    Func f{fr.start, end, static_cast<uint32_t>(t->rows_.size()), 0, fr.flags};
    const CodeRegion* region = RegionFor(code, fr.start & ~uint64_t{3}, end & ~uint64_t{3});
    if (region == nullptr) {
      ++t->stats_.without_code;
    } else {
      const uint64_t first = (fr.start + 3) & ~uint64_t{3};
      words.clear();
      // No wrap at the top of the address space: `a + 4 <= end` wrapped to 0 and read on
      // past the region.
      for (uint64_t a = first; a >= fr.start && a < end && end - a >= 4; a += 4) {
        words.push_back(LoadWord(region->bytes + (a - region->vaddr), be));
      }
      AnalysisStats as;
      std::vector<RowRange> rows =
          AnalyzeFunctionAt(words, first, (fr.flags & FunctionRange::kStub) != 0, &as);
      if (rows.size() > UINT16_MAX) rows.resize(UINT16_MAX);
      for (RowRange& r : rows) r.offset += static_cast<uint32_t>(first - fr.start);
      if (!rows.empty()) rows.front().offset = 0;
      t->rows_.insert(t->rows_.end(), rows.begin(), rows.end());
      f.num_rows = static_cast<uint16_t>(rows.size());
      t->stats_.instructions += as.instructions;
      t->stats_.unreached += as.unreached;
      t->stats_.conflicts += as.conflicts;
    }
    t->funcs_.push_back(f);
  }
  t->funcs_.shrink_to_fit();
  t->rows_.shrink_to_fit();

  // Page index.
  if (!t->funcs_.empty()) {
    t->page_base_ = t->funcs_.front().start & ~((uint64_t{1} << kPageShift) - 1);
    const uint64_t span = t->funcs_.back().end - t->page_base_;
    const uint64_t pages = (span >> kPageShift) + 1;
    // Only where it pays: a few entries per function at most. A module whose functions are
    // scattered over a sparse range (a corrupt or hostile file: three FDEs over 130 GiB)
    // would otherwise cost a page entry per 4 KiB of that range, and binary search over few
    // functions is as quick.
    if (pages <= kMaxPagesPerFunction * t->funcs_.size() + kMaxPagesPerFunction) {
      t->page_first_.resize(pages);
      size_t i = 0;
      for (uint64_t p = 0; p < pages; ++p) {
        const uint64_t page_start = t->page_base_ + (p << kPageShift);
        while (i + 1 < t->funcs_.size() && t->funcs_[i + 1].start <= page_start) ++i;
        t->page_first_[p] = static_cast<uint32_t>(i);
      }
    }
  }

  // Addresses that follow a call, for the return-address sanity check: bitmaps over the code
  // regions, regions closer than a page sharing one. Their size follows the code's, not the
  // span between far regions, and they are disjoint and sorted, so a lookup is one binary
  // search however many segments a corrupt file has. `code` is sorted by address.
  std::vector<uint64_t> span_ends;  // of each bitmap, exclusive
  std::vector<size_t> bitmap_of(code.size());
  for (size_t i = 0; i < code.size(); ++i) {
    const CodeRegion& r = code[i];
    if (r.size < 4) continue;
    const uint64_t base = r.vaddr & ~uint64_t{3};
    // Up to the word after the region's last delay slot, short of 2^64.
    const uint64_t end = r.size + 8 > UINT64_MAX - r.vaddr ? UINT64_MAX : r.vaddr + r.size + 8;
    if (span_ends.empty() ||
        (base > span_ends.back() && base - span_ends.back() > (uint64_t{1} << kPageShift))) {
      t->call_bitmaps_.push_back({base, 0, 0});
      span_ends.push_back(end);
    } else {
      span_ends.back() = std::max(span_ends.back(), end);
    }
    bitmap_of[i] = t->call_bitmaps_.size() - 1;
  }
  for (size_t j = 0; j < t->call_bitmaps_.size(); ++j) {
    CallBitmap& bitmap = t->call_bitmaps_[j];
    bitmap.bits = (span_ends[j] - bitmap.base) / 4 + 1;
    bitmap.first_word = t->after_call_.size();
    t->after_call_.resize(bitmap.first_word + (bitmap.bits + 63) / 64, 0);
  }
  for (size_t i = 0; i < code.size(); ++i) {
    const CodeRegion& r = code[i];
    if (r.size < 4) continue;
    const CallBitmap& bitmap = t->call_bitmaps_[bitmap_of[i]];
    uint64_t* words = t->after_call_.data() + bitmap.first_word;
    auto mark = [&](uint64_t addr) {
      const uint64_t bit = (addr - bitmap.base) / 4;
      if (bit < bitmap.bits) words[bit / 64] |= uint64_t{1} << (bit % 64);
    };
    const uint64_t skew = (4 - (r.vaddr & 3)) & 3;
    for (uint64_t off = skew; off + 4 <= r.size; off += 4) {
      const uint32_t w = LoadWord(r.bytes + off, be);
      if (insn::IsCallWithDelaySlot(w)) mark(r.vaddr + off + 8);
      else if (insn::IsCompactCall(w)) mark(r.vaddr + off + 4);
    }
  }

  t->stats_.functions = t->funcs_.size();
  t->stats_.rows = t->rows_.size();
  t->stats_.memory_bytes = t->funcs_.size() * sizeof(Func) + t->rows_.size() * sizeof(RowRange) +
                           t->page_first_.size() * sizeof(uint32_t) +
                           t->after_call_.size() * sizeof(uint64_t) +
                           t->call_bitmaps_.size() * sizeof(CallBitmap);
  return t;
}

int64_t PrologueTable::FindFunction(uint64_t pc) const {
  if (page_first_.empty()) return FindFunctionBinarySearch(pc);
  if (pc < page_base_) return -1;
  const uint64_t page = (pc - page_base_) >> kPageShift;
  if (page >= page_first_.size()) return -1;
  size_t i = page_first_[page];
  const size_t n = funcs_.size();
  while (i + 1 < n && funcs_[i + 1].start <= pc) ++i;
  const Func& f = funcs_[i];
  return (pc >= f.start && pc < f.end) ? static_cast<int64_t>(i) : -1;
}

int64_t PrologueTable::FindFunctionBinarySearch(uint64_t pc) const {
  size_t lo = 0, hi = funcs_.size();  // first start > pc
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (funcs_[mid].start <= pc) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return -1;
  const Func& f = funcs_[lo - 1];
  return pc < f.end ? static_cast<int64_t>(lo - 1) : -1;
}

bool PrologueTable::RowAt(const Func& f, uint64_t offset, UnwindRow* row) const {
  if (f.flags & FunctionRange::kOutermost) {
    // Process/thread entry: nothing above it, whatever its code did to sp and ra (__start
    // aligns sp with `and`, so the analysis has no CFA there).
    *row = UnwindRow{};
    row->cfa_base = UnwindRow::CfaBase::kSp;
    row->ra_rule = UnwindRow::RaRule::kUndefined;
    return true;
  }
  if (f.num_rows == 0) return false;
  const RowRange* first = rows_.data() + f.first_row;
  size_t lo = 0, hi = f.num_rows;  // first entry with offset > `offset`
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (first[mid].offset <= offset) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return false;
  const RowRange& r = first[lo - 1];
  if (!r.valid) return false;
  *row = r.row;
  return true;
}

bool PrologueTable::FindRow(uint64_t pc, bool innermost, UnwindRow* row) const {
  // A caller's pc is a return address: the call sits 8 bytes before it and the frame state
  // that holds while the callee runs is the one at the call's delay slot (pc - 4), which also
  // keeps calls to noreturn functions at a function's end inside that function.
  if (!innermost && pc < 4) return false;
  const uint64_t at = innermost ? pc : pc - 4;
  const int64_t i = FindFunction(at);
  if (i < 0) return false;
  const Func& f = funcs_[static_cast<size_t>(i)];
  return RowAt(f, at - f.start, row);
}

bool PrologueTable::IsPlausibleReturnAddress(uint64_t return_address) const {
  if ((return_address & 3) != 0) return false;
  // The last bitmap starting at or below the address.
  auto it = std::upper_bound(
      call_bitmaps_.begin(), call_bitmaps_.end(), return_address,
      [](uint64_t address, const CallBitmap& b) { return address < b.base; });
  if (it == call_bitmaps_.begin()) return false;
  const CallBitmap& b = *std::prev(it);
  const uint64_t bit = (return_address - b.base) / 4;
  return bit < b.bits && (after_call_[b.first_word + bit / 64] >> (bit % 64)) & 1;
}

}  // namespace strata::unwind::mips64
