/* A freestanding MIPS64 program used as a big-endian / little-endian ELF fixture. */
int fixture_leaf(int x) { return x * 3 + 1; }
int fixture_caller(int x) { return fixture_leaf(x) + fixture_leaf(x + 1); }
void __start(void) { for (;;) fixture_caller(1); }
