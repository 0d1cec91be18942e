//go:build cgo

package main

import "C"

// Called back from C (cgo.go's strata_c_calls_back) on the callback goroutine's stack.
//
//export strataGoCallback
func strataGoCallback(x C.ulong) C.ulong {
	return C.ulong(goSpin(uint64(x), 400000))
}

//go:noinline
func goSpin(x uint64, n int) uint64 {
	for i := 0; i < n; i++ {
		x = x*2862933555777941757 + 3037000493
	}
	return x
}
