//go:build cgo

// The cgo variant calls into C on the encoding goroutine: C frames (unwound with the C
// code's CFI) on the system stack under runtime.asmcgocall. Its callback goroutine calls C
// that calls back into Go (callback.go): Go frames under runtime.cgocallback, then the C
// frames, then the Go code that called C.

package main

// static unsigned long strata_c_spin(unsigned long n) {
//   unsigned long x = n;
//   for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
//   return x;
// }
// extern unsigned long strataGoCallback(unsigned long);
// __attribute__((noinline)) unsigned long strata_c_calls_back(unsigned long n) {
//   unsigned long x = strata_c_spin(n);
//   for (int i = 0; i < 4; i++) x ^= strataGoCallback(x);
//   return x;
// }
import "C"

import "time"

func cgoWork() {
	sink ^= byte(C.strata_c_spin(20000))
}

//go:noinline
func callbackWorker(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		sink ^= byte(C.strata_c_calls_back(200000))
		time.Sleep(time.Millisecond)
	}
}
