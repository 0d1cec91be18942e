// The frame capture's program as the kernel's verifier sees it. (Its copies of live
// interpreters' frames are checked in interpreter_test.cc.)
#include "agent/python/frame_capture.h"

#include <linux/bpf.h>

#include <cstdio>

#include "gtest/gtest.h"

namespace strata::agent::python {
namespace {

// Loaded here, and as the verifier of an architecture without efficient unaligned access
// (MIPS64) would check it. A kernel without BPF, or an agent that may not load programs,
// skips; a refusal by the verifier is a failure. The program that runs, with its ring, is
// made at the first thread registered, not before.
TEST(FrameCaptureTest, TheVerifierAcceptsTheProgram) {
  absl::StatusOr<Offsets> offsets = OffsetsForVersion(3, 11);
  ASSERT_TRUE(offsets.ok());
  CaptureThread thread;
  ASSERT_TRUE(thread.Set(0x1000, offsets->tstate_native_thread_id, 42, 7, *offsets));
  for (const uint32_t flags : {0u, static_cast<uint32_t>(BPF_F_STRICT_ALIGNMENT)}) {
    absl::StatusOr<std::unique_ptr<FrameCapture>> capture = FrameCapture::Create(flags);
    if (absl::IsUnavailable(capture.status()) || absl::IsPermissionDenied(capture.status())) {
      GTEST_SKIP() << "no BPF here: " << capture.status();
    }
    ASSERT_TRUE(capture.ok()) << "flags " << flags << ": " << capture.status();
    EXPECT_EQ((*capture)->program_fd(), -1);
    ASSERT_TRUE((*capture)->Register(1234, thread).ok()) << "flags " << flags;
    EXPECT_GE((*capture)->program_fd(), 0);
  }
}

TEST(FrameCaptureTest, RegistersOnlyLayoutsTheProgramCanFollow) {
  absl::StatusOr<Offsets> offsets = OffsetsForVersion(3, 11);
  ASSERT_TRUE(offsets.ok());
  CaptureThread thread;
  ASSERT_TRUE(thread.Set(0x1000, offsets->tstate_native_thread_id, 42, 7, *offsets));
  EXPECT_EQ(thread.check_at % 8, 0u);
  EXPECT_EQ(thread.frame_at % 8, 0u);
  EXPECT_LE(thread.tstate_span, kMaxCapturedTstate);
  EXPECT_EQ(thread.tstate_span_start + thread.check_at, offsets->tstate_native_thread_id);
  EXPECT_EQ(thread.tstate_span_start + thread.frame_at, offsets->tstate_frame);
  EXPECT_LE(thread.frame_copy_from, offsets->frame_code);
  // A thread state whose fields lie further apart than the program copies in one read.
  Offsets apart = *offsets;
  apart.tstate_native_thread_id = apart.tstate_frame + kMaxCapturedTstate;
  EXPECT_FALSE(thread.Set(0x1000, apart.tstate_native_thread_id, 42, 7, apart));
  Offsets big = *offsets;
  big.frame_size = kMaxCopiedStruct + 8;
  EXPECT_FALSE(thread.Set(0x1000, big.tstate_native_thread_id, 42, 7, big));

  absl::StatusOr<std::unique_ptr<FrameCapture>> capture = FrameCapture::Create();
  if (!capture.ok()) GTEST_SKIP() << "no BPF here: " << capture.status();
  ASSERT_TRUE((*capture)->Register(1234, thread).ok());
  EXPECT_TRUE((*capture)->registered(1234));
  EXPECT_EQ((*capture)->Find(1234, 1'000'000'000), nullptr);  // no sample of it yet
  EXPECT_EQ((*capture)->stats().missing, 1u);
  (*capture)->Forget(1234);
  EXPECT_FALSE((*capture)->registered(1234));
  EXPECT_EQ((*capture)->Find(1234, 1'000'000'000), nullptr);
}

}  // namespace
}  // namespace strata::agent::python
