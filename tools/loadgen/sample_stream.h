// Sample streams for the load generator and the encoding benchmark: a sequence of shipping
// intervals, each a list of distinct outer->leaf stacks with sample counts. Either
// synthesized (a program-like call graph with recursion and Zipf-distributed hot paths) or
// read from a recorded text file.
//
// Text format (one stack per line, folded-stack style, outermost frame first):
//
//   # comment
//   ---                                     starts a new interval (the first is implicit)
//   main;run+0x4a;parse+0x1c;lex 17         frames separated by ';', then a space and the count
//   [truncated];worker+0x10;memcpy 3        '[truncated]' first: unwinding stopped early
//
// A frame is `function` or `function+0xCALLSITE`; the call site (return-address offset in the
// caller's module) belongs to the call made from this frame to the next one and is ignored on
// the leaf. Without it, call sites default to 0. Function names are interned in order of first
// appearance; a stack may repeat within an interval (counts add up).
#ifndef STRATA_TOOLS_LOADGEN_SAMPLE_STREAM_H_
#define STRATA_TOOLS_LOADGEN_SAMPLE_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::loadgen {

struct StreamFrame {
  uint32_t function = 0;  // index into SampleStream::function_names
  uint64_t call_site = 0;
};

struct StreamStack {
  bool truncated = false;
  std::vector<StreamFrame> frames;  // outermost first
  uint64_t count = 0;
};

struct SampleStream {
  std::vector<std::string> function_names;
  std::vector<std::vector<StreamStack>> intervals;
};

// Parses the text format above. Errors on malformed lines (with the line number).
absl::StatusOr<SampleStream> ParseSampleStream(const std::string& text);
std::string FormatSampleStream(const SampleStream& stream);

struct SyntheticOptions {
  uint32_t functions = 6000;
  uint32_t distinct_paths = 20000;  // pool of hot/cold paths
  uint32_t samples_per_interval = 8000;  // 8 threads x 99 Hz x 10 s
  uint32_t intervals = 30;
  double zipf_s = 1.1;
  uint32_t seed = 12345;
};

// A program-like call graph (layered calls, utility functions with thousands of callers, self
// and mutual recursion), a pool of paths from random walks, samples drawn Zipf-distributed from
// the pool in every interval.
SampleStream SynthesizeSampleStream(const SyntheticOptions& options);

}  // namespace strata::loadgen

#endif  // STRATA_TOOLS_LOADGEN_SAMPLE_STREAM_H_
