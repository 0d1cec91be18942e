#include "server/store/store.h"
#include "gtest/gtest.h"
TEST(StoreTest, Opens) {}
