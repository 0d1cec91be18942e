#include "server/aggregate/phase_event.h"

#include <string>

#include "gtest/gtest.h"
#include "strata/v1/query.pb.h"

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

// Earlier servers stored a serialized v1::PhaseChange; none of them looks like this encoding.
TEST(PhaseEventTest, SerializedPhaseChangesAreToldApart) {
  v1::PhaseChange change;
  EXPECT_FALSE(IsPhaseEventPayload(change.SerializeAsString()));  // empty
  change.set_window_start_ms(10'000);
  EXPECT_FALSE(IsPhaseEventPayload(change.SerializeAsString()));
  change.set_service("api");
  EXPECT_FALSE(IsPhaseEventPayload(change.SerializeAsString()));
  v1::PhaseChange only_shifts;
  only_shifts.add_fell()->set_count_before(5);
  EXPECT_FALSE(IsPhaseEventPayload(only_shifts.SerializeAsString()));
  only_shifts.clear_fell();
  only_shifts.add_rose()->set_count_after(5);
  EXPECT_FALSE(IsPhaseEventPayload(only_shifts.SerializeAsString()));
  only_shifts.set_detected_ms(1);
  EXPECT_FALSE(IsPhaseEventPayload(only_shifts.SerializeAsString()));
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
