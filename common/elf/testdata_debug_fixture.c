// The shared object of the debug-file fixtures (make_debug_fixtures.sh): one exported function
// (named by .dynsym, which stripping keeps) and one static function that only a symbol table
// (the module's own, MiniDebugInfo's or a debug file's) names.
__attribute__((noinline, used)) static int strata_debug_fixture_local(int x) {
  __asm__ volatile("" ::: "memory");
  return x * 3 + 1;
}

int strata_debug_fixture_exported(int x) { return strata_debug_fixture_local(x) + 2; }
