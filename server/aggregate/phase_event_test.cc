#include "server/aggregate/phase_event.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::server::aggregate {
namespace {

TEST(PhaseEventTest, RoundTrips) {
  PhaseEventPayload event;
  event.detected_ms = 1'764'000'000'123;
  event.rose = {{0xfedcba9876543210ull, 3, 300}, {7, 0, 51}};
  event.fell = {{1, 200, 10}};
  const std::string payload = EncodePhaseEvent(event);
  EXPECT_TRUE(IsPhaseEventPayload(payload));
  auto decoded = DecodePhaseEvent(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, event);

  EXPECT_TRUE(DecodePhaseEvent(EncodePhaseEvent({})).ok());
}

TEST(PhaseEventTest, MalformedPayloadsAreDataLoss) {
  PhaseEventPayload event;
  event.rose = {{5, 1, 100}};
  const std::string payload = EncodePhaseEvent(event);
  for (size_t n = 0; n < payload.size(); ++n) {
    EXPECT_EQ(DecodePhaseEvent(payload.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n;
  }
  EXPECT_EQ(DecodePhaseEvent(payload + "x").status().code(), absl::StatusCode::kDataLoss);
  std::string future = payload;
  future[0] = 2;  // a later version
  EXPECT_EQ(DecodePhaseEvent(future).status().code(), absl::StatusCode::kDataLoss);
  // A count of shifts beyond the bytes left.
  EXPECT_EQ(DecodePhaseEvent(std::string("\x01\x00\x7f", 3)).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata::server::aggregate
