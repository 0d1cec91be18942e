// TopLinesOfStacks: self samples per line from a profile with lines, Python and Java frames
// counting the native code they call.
#include "server/query/lines.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::query {
namespace {

using ::testing::ElementsAre;

// "function file:line" of each frame of each line, innermost first, and its samples.
std::vector<std::string> Rows(const v1::TopResponse& r) {
  std::vector<std::string> out;
  for (const v1::LineStat& l : r.lines()) {
    std::string row;
    for (const v1::Frame& f : l.frames()) {
      row += f.function() + " " + f.file() + ":" + std::to_string(f.line()) +
             (f.inlined() ? " [inlined] < " : "");
    }
    out.push_back(row + " " + std::to_string(l.self()));
  }
  return out;
}

TEST(TopLinesOfStacksTest, PythonAndJavaFramesCountTheNativeCodeTheyCall) {
  Profile p;
  p.functions = {
      {1, "_start", "/usr/bin/python3.11", "", 0, false, ""},                      // 0
      {2, "main", "[python:app.py]", "app.py", 10, false, ""},                     // 1
      {3, "score", "[python:model.py]", "model.py", 7, false, ""},                 // 2
      {4, "_PyObject_Malloc", "/usr/bin/python3.11", "", 0, false, ""},             // 3
      {5, "score", "[python:model.py]", "model.py", 9, false, ""},                 // 4
      {6, "Mix", "/srv/native", "mix.h", 13, true, ""},                           // 5
      {7, "Spin", "/srv/native", "spin.cc", 24, false, ""},                       // 6
      {8, "Spin.inner", "[java:Spin.java]", "Spin.java", 6, false, ""},           // 7
      {9, "JVM_Foo", "/usr/lib/jvm/libjvm.so", "", 0, false, ""},                  // 8
  };
  p.stacks = {
      {1, 5, false, {0, 1, 2, 3}},  // Python calling native code: at score's call site
      {2, 2, false, {0, 1, 4}},     // Python as the leaf: at its line
      {3, 4, false, {6, 5}},        // native only: its leaf, inlined into Spin
      {4, 3, false, {7, 8}},        // Java calling into the JVM
      {5, 1, false, {0, 3}},        // native without a line
  };
  p.total = 15;
  p.unreachable_nodes = {"n2"};
  const v1::TopResponse r = TopLinesOfStacks(p, 10);
  EXPECT_EQ(r.total_samples(), 15u);
  EXPECT_EQ(r.unresolved_samples(), 1u);
  EXPECT_THAT(r.unreachable_nodes(), ElementsAre("n2"));
  EXPECT_THAT(Rows(r),
              ElementsAre("score model.py:7 5", "Mix mix.h:13 [inlined] < Spin spin.cc:24 4",
                          "Spin.inner Spin.java:6 3", "score model.py:9 2",
                          "_PyObject_Malloc :0 1"));
  EXPECT_EQ(r.lines(0).frames(0).kind(), v1::FRAME_PYTHON);
  EXPECT_EQ(TopLinesOfStacks(p, 2).lines_size(), 2);
}

}  // namespace
}  // namespace strata::server::query
