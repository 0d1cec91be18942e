#include "agent/core/leaf_histogram.h"

#include "gtest/gtest.h"

namespace strata::agent {
namespace {

TEST(LeafHistogramTest, ShipsSortedDeltaEncodedAddressesOfNamedTargetsAndClears) {
  LeafHistogram leaves;
  leaves.Add(/*target=*/2, /*node=*/7, 0x1010);
  leaves.Add(2, 7, 0x1000);
  leaves.Add(2, 7, 0x1010);
  leaves.Add(1, 9, 0x20);
  leaves.Add(2, 5, 0x400);
  leaves.Add(3, 5, 0x400);  // a target the batch does not name
  v1::SampleBatch batch;
  leaves.TakeInto({1, 2}, &batch);
  ASSERT_EQ(batch.leaf_addresses_size(), 3);
  const v1::LeafAddresses& a = batch.leaf_addresses(0);
  EXPECT_EQ(a.target_id(), 1u);
  EXPECT_EQ(a.node(), 9u);
  EXPECT_EQ(a.offset_deltas(0), 0x20u);
  EXPECT_EQ(a.counts(0), 1u);
  const v1::LeafAddresses& b = batch.leaf_addresses(1);
  EXPECT_EQ(b.target_id(), 2u);
  EXPECT_EQ(b.node(), 5u);
  const v1::LeafAddresses& c = batch.leaf_addresses(2);
  EXPECT_EQ(c.node(), 7u);
  ASSERT_EQ(c.offset_deltas_size(), 2);
  EXPECT_EQ(c.offset_deltas(0), 0x1000u);  // from 0
  EXPECT_EQ(c.offset_deltas(1), 0x10u);    // from the previous offset
  EXPECT_EQ(c.counts(0), 1u);
  EXPECT_EQ(c.counts(1), 2u);
  EXPECT_EQ(leaves.size(), 0u);  // cleared, the unnamed target's counts too
  v1::SampleBatch next;
  leaves.TakeInto({1, 2, 3}, &next);
  EXPECT_EQ(next.leaf_addresses_size(), 0);
}

TEST(LeafHistogramTest, AddressesPastTheBoundAreCountedAsDropped) {
  LeafHistogram leaves(/*max_entries=*/2);
  leaves.Add(1, 2, 10);
  leaves.Add(1, 2, 20);
  leaves.Add(1, 2, 30);  // new: over the bound
  leaves.Add(1, 2, 10);  // known: still counted
  EXPECT_EQ(leaves.size(), 2u);
  EXPECT_EQ(leaves.dropped(), 1u);
  v1::SampleBatch batch;
  leaves.TakeInto({1}, &batch);
  ASSERT_EQ(batch.leaf_addresses_size(), 1);
  EXPECT_EQ(batch.leaf_addresses(0).counts(0), 2u);
}

}  // namespace
}  // namespace strata::agent
