#include "agent/core/capture_controller.h"

#include <time.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

// Records what the controller asks of the sessions; each session's "samples" are set by the
// test and handed out once by TakeSessionBatch.
class FakeSessions final : public SamplingSessions {
 public:
  struct Started {
    uint32_t session_id;
    uint32_t frequency_hz;
    std::string service;
    pid_t pid;
  };

  absl::Status StartSession(uint32_t session_id, uint32_t frequency_hz,
                            const std::string& service, pid_t pid) override {
    if (!start_error.ok()) return start_error;
    started.push_back({session_id, frequency_hz, service, pid});
    open.insert(session_id);
    return absl::OkStatus();
  }
  absl::Status SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz) override {
    rates[session_id] = frequency_hz;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeSessionBatch(
      uint32_t session_id, const std::string& capture_id, int64_t start_ms, int64_t end_ms,
      uint64_t sequence, uint64_t* samples) override {
    const uint64_t n = pending[session_id];
    pending[session_id] = 0;
    if (samples != nullptr) *samples = n;
    if (n == 0) return std::nullopt;
    v1::SampleBatch batch;
    batch.set_capture_id(capture_id);
    batch.set_sequence(sequence);
    batch.set_start_ms(start_ms);
    batch.set_end_ms(end_ms);
    return batch;
  }
  void StopSession(uint32_t session_id) override {
    stopped.push_back(session_id);
    open.erase(session_id);
  }
  void ReleaseSession(uint32_t session_id) override { released.push_back(session_id); }
  size_t SessionTargets(uint32_t session_id) const override { return 1; }

  absl::Status start_error;
  std::vector<Started> started;
  std::set<uint32_t> open;
  std::map<uint32_t, uint32_t> rates;
  std::map<uint32_t, uint64_t> pending;
  std::vector<uint32_t> stopped;
  std::vector<uint32_t> released;
};

class CaptureControllerTest : public ::testing::Test {
 protected:
  CaptureController Make(CaptureControllerOptions options = {}) {
    return CaptureController(
        &sessions_, options,
        {[this](v1::SampleBatch b) { batches_.push_back(std::move(b)); },
         [this](v1::CaptureStatus s) { statuses_.push_back(std::move(s)); }});
  }

  static v1::ServerMessage Start(const std::string& id, uint32_t hz, uint32_t duration_ms,
                                 const std::string& service = "", uint32_t pid = 0) {
    v1::ServerMessage m;
    v1::StartCapture* s = m.mutable_start_capture();
    s->set_capture_id(id);
    s->set_frequency_hz(hz);
    s->set_duration_ms(duration_ms);
    s->set_service(service);
    s->set_pid(pid);
    return m;
  }

  static v1::ServerMessage Stop(const std::string& id) {
    v1::ServerMessage m;
    m.mutable_stop_capture()->set_capture_id(id);
    return m;
  }

  FakeSessions sessions_;
  std::vector<v1::SampleBatch> batches_;
  std::vector<v1::CaptureStatus> statuses_;
  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  uint64_t sequence_ = 41;
};

TEST_F(CaptureControllerTest, StartsASessionAtTheRequestedRateCappedByTheMaximum) {
  CaptureController captures = Make({.max_frequency_hz = 500});
  captures.HandleMessage(Start("cap-1", 997, 10'000, "web", 1234));
  captures.Tick(t0_, &sequence_);
  ASSERT_EQ(sessions_.started.size(), 1u);
  EXPECT_NE(sessions_.started[0].session_id, 0u);  // 0 is continuous profiling
  EXPECT_EQ(sessions_.started[0].frequency_hz, 500u);
  EXPECT_EQ(sessions_.started[0].service, "web");
  EXPECT_EQ(sessions_.started[0].pid, 1234);
  EXPECT_EQ(captures.running(), 1u);
  ASSERT_EQ(statuses_.size(), 1u);
  EXPECT_EQ(statuses_[0].capture_id(), "cap-1");
  EXPECT_EQ(statuses_[0].effective_frequency_hz(), 500u);
  EXPECT_FALSE(statuses_[0].finished());

  // A repeated StartCapture is the same capture.
  captures.HandleMessage(Start("cap-1", 997, 10'000));
  captures.Tick(t0_, &sequence_);
  EXPECT_EQ(sessions_.started.size(), 1u);
}

TEST_F(CaptureControllerTest, RefusesMalformedStartsAndReportsSessionErrors) {
  CaptureController captures = Make();
  captures.HandleMessage(Start("", 99, 1000));
  captures.HandleMessage(Start("no-duration", 99, 0));
  sessions_.start_error = absl::NotFoundError("this agent profiles no process of service 'x'");
  captures.HandleMessage(Start("no-target", 99, 1000, "x"));
  captures.Tick(t0_, &sequence_);
  EXPECT_EQ(captures.running(), 0u);
  EXPECT_TRUE(sessions_.started.empty());
  ASSERT_EQ(statuses_.size(), 3u);
  for (const auto& s : statuses_) {
    EXPECT_TRUE(s.finished());
    EXPECT_FALSE(s.error().empty());
  }
  EXPECT_EQ(statuses_[2].capture_id(), "no-target");
  EXPECT_EQ(statuses_[2].error(), "this agent profiles no process of service 'x'");
}

TEST_F(CaptureControllerTest, ShipsSamplesEveryIntervalAndFinishesWhenTheDurationPasses) {
  CaptureController captures = Make({.cpu_budget = 100,  // never cut in this test
                                     .ship_interval = absl::Seconds(1)});
  captures.HandleMessage(Start("cap", 99, 2'500));
  captures.Tick(t0_, &sequence_);
  const uint32_t session = sessions_.started.at(0).session_id;
  statuses_.clear();

  sessions_.pending[session] = 7;
  captures.Tick(t0_ + absl::Milliseconds(500), &sequence_);  // not due yet
  EXPECT_TRUE(batches_.empty());
  captures.Tick(t0_ + absl::Seconds(1), &sequence_);
  ASSERT_EQ(batches_.size(), 1u);
  EXPECT_EQ(batches_[0].capture_id(), "cap");
  EXPECT_EQ(batches_[0].sequence(), 42u);
  EXPECT_EQ(batches_[0].start_ms(), absl::ToUnixMillis(t0_));
  EXPECT_EQ(batches_[0].end_ms(), absl::ToUnixMillis(t0_ + absl::Seconds(1)));
  EXPECT_EQ(sequence_, 42u);
  ASSERT_EQ(statuses_.size(), 1u);
  EXPECT_EQ(statuses_[0].samples(), 7u);
  EXPECT_FALSE(statuses_[0].finished());

  // An interval without samples ships no batch but still reports progress.
  captures.Tick(t0_ + absl::Seconds(2), &sequence_);
  EXPECT_EQ(batches_.size(), 1u);
  EXPECT_EQ(statuses_.size(), 2u);

  sessions_.pending[session] = 3;
  captures.Tick(t0_ + absl::Milliseconds(2'500), &sequence_);
  EXPECT_EQ(captures.running(), 0u);
  EXPECT_EQ(sessions_.stopped, std::vector<uint32_t>{session});
  EXPECT_EQ(sessions_.released, std::vector<uint32_t>{session});
  ASSERT_EQ(batches_.size(), 2u);
  EXPECT_EQ(batches_[1].sequence(), 43u);
  EXPECT_EQ(batches_[1].start_ms(), absl::ToUnixMillis(t0_ + absl::Seconds(2)));
  const v1::CaptureStatus& last = statuses_.back();
  EXPECT_TRUE(last.finished());
  EXPECT_TRUE(last.error().empty());
  EXPECT_EQ(last.samples(), 10u);
}

TEST_F(CaptureControllerTest, AServerStopIsNoErrorButShutdownIs) {
  CaptureController captures = Make({.cpu_budget = 100});
  captures.HandleMessage(Start("stopped", 99, 60'000));
  captures.HandleMessage(Start("cut-short", 99, 60'000));
  captures.Tick(t0_, &sequence_);
  ASSERT_EQ(captures.running(), 2u);
  statuses_.clear();

  captures.HandleMessage(Stop("stopped"));
  captures.Tick(t0_ + absl::Milliseconds(100), &sequence_);
  ASSERT_EQ(statuses_.size(), 1u);
  EXPECT_EQ(statuses_[0].capture_id(), "stopped");
  EXPECT_TRUE(statuses_[0].finished());
  EXPECT_TRUE(statuses_[0].error().empty());

  captures.StopAll(t0_ + absl::Milliseconds(200), &sequence_);
  EXPECT_EQ(captures.running(), 0u);
  ASSERT_EQ(statuses_.size(), 2u);
  EXPECT_EQ(statuses_[1].capture_id(), "cut-short");
  EXPECT_TRUE(statuses_[1].finished());
  EXPECT_EQ(statuses_[1].error(), "the agent is shutting down");
  EXPECT_EQ(sessions_.released.size(), 2u);
  EXPECT_TRUE(sessions_.open.empty());
}

TEST_F(CaptureControllerTest, SetRateChangesContinuousProfilingWithinBounds) {
  CaptureController captures = Make({.max_frequency_hz = 1000});
  v1::ServerMessage m;
  m.mutable_set_rate()->set_frequency_hz(5000);
  captures.HandleMessage(m);
  m.mutable_set_rate()->set_frequency_hz(0);
  captures.HandleMessage(m);
  captures.Tick(t0_, &sequence_);
  // Applied in order: the last one wins, clamped to [1, max].
  EXPECT_EQ(sessions_.rates.at(0), 1u);
  EXPECT_EQ(captures.running(), 0u);
}

int64_t ProcessCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void BurnCpu(absl::Duration cpu) {
  const int64_t until = ProcessCpuNs() + absl::ToInt64Nanoseconds(cpu);
  volatile uint64_t x = 0;
  while (ProcessCpuNs() < until) x = x + 1;
}

TEST_F(CaptureControllerTest, LowersTheCaptureRateWhenTheAgentExceedsItsCpuBudget) {
  // 0.1 % of a core over 1 s of (test) wall time: 20 ms of CPU is twenty times that.
  CaptureController captures = Make({.cpu_budget = 0.001,
                                     .ship_interval = absl::Hours(1),
                                     .budget_interval = absl::Seconds(1)});
  captures.HandleMessage(Start("cap", 1000, 60'000));
  captures.Tick(t0_, &sequence_);
  const uint32_t session = sessions_.started.at(0).session_id;
  BurnCpu(absl::Milliseconds(20));
  captures.Tick(t0_ + absl::Seconds(1), &sequence_);
  ASSERT_TRUE(sessions_.rates.contains(session));
  const uint32_t cut = sessions_.rates[session];
  EXPECT_LT(cut, 1000u);
  EXPECT_GE(cut, 1u);
  // Every further second over budget cuts again, never below 1 Hz.
  for (int i = 2; i < 40; ++i) {
    BurnCpu(absl::Milliseconds(20));
    captures.Tick(t0_ + absl::Seconds(i), &sequence_);
  }
  EXPECT_EQ(sessions_.rates[session], 1u);
  captures.StopAll(t0_ + absl::Seconds(40), &sequence_);
  // The status reports the rate in force.
  EXPECT_EQ(statuses_.back().effective_frequency_hz(), 1u);
}

}  // namespace
}  // namespace strata::agent
