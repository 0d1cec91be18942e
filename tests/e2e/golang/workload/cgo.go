//go:build cgo

// The cgo variant calls into C on the encoding goroutine: C frames (unwound with the C
// code's CFI) on the system stack under runtime.asmcgocall.

package main

// static unsigned long strata_c_spin(unsigned long n) {
//   unsigned long x = n;
//   for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
//   return x;
// }
import "C"

func cgoWork() {
	sink ^= byte(C.strata_c_spin(20000))
}
