// A library the symbols test loads with dlopen after its first refresh.
extern "C" __attribute__((noinline)) int strata_symbols_test_dso_function(int x) {
  asm volatile("" ::: "memory");
  return x * 5 + 2;
}
