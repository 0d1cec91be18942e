#!/usr/bin/env bash
# Regenerates the committed seed corpora (fuzz/corpus/<target>/) that come from the project's
# encoders and from small ELF files: builds a few tiny x86-64 and MIPS64 modules (stripped,
# a few KB each), then runs strata-fuzz-seeds (fuzz/seed_generator.cc) over them.
# Crash reproducers kept in the corpora (named crash-*) are left alone.
#   fuzz/make-seeds.sh [BUILD_DIR]    (default build-sanitize, configured with STRATA_FUZZ=ON)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-sanitize}
cmake --build "$build" --target strata-fuzz-seeds -j "${JOBS:-2}" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/module.c" <<'C'
#include <alloca.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) static int walk(const char* s, int depth) {
  if (depth == 0 || *s == 0) return (int)strlen(s);
  return walk(s + 1, depth - 1) + s[0];
}
__attribute__((noinline)) int tokenize(const char* s) {
  char* copy = malloc(strlen(s) + 1);
  strcpy(copy, s);
  int n = walk(copy, 8);
  free(copy);
  return n;
}
static void on_signal(int sig) { (void)sig; }
int serve(int argc, char** argv) {
  signal(SIGPROF, on_signal);
  char* big = alloca(argc * 4096);
  memset(big, 0, argc * 4096);
  int total = big[argc];
  for (int i = 0; i < argc; ++i) total += tokenize(argv[i]);
  printf("%d\n", total);
  return total;
}
C
cat >"$work/tiny.c" <<'C'
__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }
__attribute__((noinline)) long middle(long x) { return leaf(x) + leaf(x + 1); }
void _start(void) {
  volatile long r = middle(4);
  (void)r;
  for (;;) {}
}
C
elfs=()
# x86-64: a shared object with PLT calls into libc (eh_frame + eh_frame_hdr + .dynsym), a
# static -nostdlib executable with symbols and build ID, and one with .debug_frame only.
gcc -O2 -shared -fPIC -Wl,--build-id -Wl,-z,noseparate-code -o "$work/x86_64_module.so" "$work/module.c"
strip --strip-unneeded "$work/x86_64_module.so"
gcc -O1 -nostdlib -static -Wl,--build-id -Wl,-z,noseparate-code -o "$work/x86_64_tiny" "$work/tiny.c"
strip --strip-debug "$work/x86_64_tiny"
gcc -O1 -g -nostdlib -static -fno-asynchronous-unwind-tables -fno-unwind-tables \
  -o "$work/x86_64_debug_frame" "$work/tiny.c"
objcopy $(readelf -SW "$work/x86_64_debug_frame" | grep -o '\.debug_[a-z_]*' | sort -u |
          grep -v '^\.debug_frame$' | sed 's/^/--remove-section=/') "$work/x86_64_debug_frame"
elfs+=("$work/x86_64_module.so" "$work/x86_64_tiny" "$work/x86_64_debug_frame")
# MIPS64 of both byte orders (Debian's cross compilers), as common/elf's test fixtures are
# built, plus a PIC shared object (stubs, $gp prologues).
for arch in mips64el mips64; do
  cc=$arch-linux-gnuabi64-gcc
  command -v "$cc" >/dev/null || { echo "make-seeds: no $cc, skipping $arch" >&2; continue; }
  $cc -O1 -g -nostdlib -static -Wl,--build-id -fno-pic -mno-abicalls \
    -fasynchronous-unwind-tables -o "$work/${arch}_fixture" common/elf/testdata_mips_fixture.c
  $cc -O0 -nostdlib -static -Wl,--build-id -Wl,-e,_start -fno-pic -mno-abicalls -o "$work/${arch}_tiny_O0" \
    "$work/tiny.c"
  $cc -O2 -shared -fPIC -Wl,--build-id -o "$work/${arch}_module.so" "$work/module.c"
  for f in "$work/${arch}_fixture" "$work/${arch}_tiny_O0" "$work/${arch}_module.so"; do
    $arch-linux-gnuabi64-strip --strip-debug "$f"
  done
  elfs+=("$work/${arch}_fixture" "$work/${arch}_tiny_O0" "$work/${arch}_module.so")
done

"$build/fuzz/strata-fuzz-seeds" fuzz/corpus "${elfs[@]}"
du -sh fuzz/corpus
for d in fuzz/corpus/*/; do printf '%-20s %3d files %6d bytes\n' "$(basename "$d")" \
  "$(ls "$d" | wc -l)" "$(cat "$d"/* | wc -c)"; done
