// For tests that assert a region allocates nothing: linking counting_allocator.cc replaces the
// global operator new with a counting malloc wrapper (one binary per such test: the
// replacement applies to the whole program).
#ifndef STRATA_COMMON_TESTING_COUNTING_ALLOCATOR_H_
#define STRATA_COMMON_TESTING_COUNTING_ALLOCATOR_H_

#include <cstdint>

namespace strata::testing {

// Global operator new calls so far, from every thread.
uint64_t AllocationCount();

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_COUNTING_ALLOCATOR_H_
