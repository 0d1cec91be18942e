// A small Go program for the .gopclntab parser's tests. Run with "frames", it prints the
// runtime's own view of its call stack (pc, function, file, line per frame, inlined calls
// included), which the tests compare with what the parser derives from the binary.
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
)

var sink int

//go:noinline
func capture(n int) []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(1, pcs)]
}

// inlinedLeaf is small enough for the compiler to inline into caller.
func inlinedLeaf(n int) []uintptr {
	return capture(n * 2)
}

//go:noinline
func caller(n int) []uintptr {
	sink += n
	return inlinedLeaf(n + 1)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "frames" {
		pcs := caller(3)
		frames := runtime.CallersFrames(pcs)
		for {
			f, more := frames.Next()
			fmt.Printf("%#x %s %s %d\n", f.PC, f.Function, f.File, f.Line)
			if !more {
				break
			}
		}
		return
	}
	s := sha256.Sum256([]byte(os.Args[0]))
	fmt.Println(s[0])
}
