// The capture chain built with frame pointers (see unwind_test_chain.cc).
#define STRATA_CHAIN_SUFFIX Fp
#include "common/unwind/unwind_test_chain.cc"
