// A Go workload for Strata's end-to-end test of Go profiling: goroutines burn CPU, one
// hashing with crypto/sha256, one sorting with sort.Ints and encoding with encoding/json and,
// with -switches, one allocating (its CPU much on the system stack: GC assists, spans from the
// heap, runtime.GC) and, with cgo, one in C code that calls back into Go, while the program
// writes its own runtime/pprof CPU profile -- the reference the test compares Strata's
// profile of it with. Prints "ready", then waits for SIGUSR1 (the profiler is attached) before
// it starts its profile and its goroutines, so that both profiles cover the same work; both
// stop after -seconds (or, with -cpu-seconds, once the process has used that much CPU: as
// many samples on a loaded machine, taking longer), then it prints each goroutine's thread
// CPU time
// (/proc/thread-self/schedstat: run ns, wait ns, slices) and the process's CPU time while the
// profile ran (getrusage: the CPU time the profile should account for), and exits.
package main

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"syscall"
	"time"
)

var sink byte

// On the heap: a buffer on the goroutine's stack would make hashWorker's frame larger than a
// profiler's stack copy.
var buf = make([]byte, 16<<10)

//go:noinline
func hashWorker(stop <-chan struct{}) {
	for i := range buf {
		buf[i] = byte(i)
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		for i := 0; i < 8; i++ {
			s := sha256.Sum256(buf)
			sink ^= s[0]
		}
	}
}

type record struct {
	ID     int      `json:"id"`
	Name   string   `json:"name"`
	Values []int    `json:"values"`
	Tags   []string `json:"tags"`
}

//go:noinline
func sortAndEncode(stop <-chan struct{}) {
	r := rand.New(rand.NewSource(1))
	xs := make([]int, 4096)
	recs := make([]record, 64)
	for {
		select {
		case <-stop:
			return
		default:
		}
		for i := range xs {
			xs[i] = r.Int()
		}
		sort.Ints(xs)
		for i := range recs {
			recs[i] = record{ID: i, Name: fmt.Sprint("record-", i), Values: xs[i : i+16],
				Tags: []string{"a", "b", "c"}}
		}
		b, err := json.Marshal(recs)
		if err != nil {
			panic(err)
		}
		var out []record
		if err := json.Unmarshal(b, &out); err != nil {
			panic(err)
		}
		sink ^= byte(len(out))
		cgoWork()
		// Less CPU than the hashing goroutine, so the top functions of both profiles are the
		// hashing goroutine's whatever the machine's load (near 50/50 they would tie).
		time.Sleep(time.Millisecond)
	}
}

type node struct {
	left, right *node
	payload     [4]*int
}

// A tree of pointers, so that every GC cycle has marking to do.
func tree(depth int) *node {
	if depth == 0 {
		return nil
	}
	return &node{left: tree(depth - 1), right: tree(depth - 1)}
}

var live *node

// Large allocations (spans from the heap) kept from the stack: a constant-size buffer that
// does not escape would sit in the goroutine's frame.
var bigBuf []byte

// Allocates without pause: small pointer-rich objects that keep the heap growing against a
// live tree (the GC makes it assist: marking on the system stack), large buffers (spans from
// the heap, on the system stack) and, now and then, a forced collection.
//
//go:noinline
func allocWorker(stop <-chan struct{}) {
	live = tree(16)
	var keep []*node
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		for j := 0; j < 512; j++ {
			keep = append(keep, &node{})
			if len(keep) > 1<<14 {
				keep = keep[:0]
			}
		}
		if i%16 == 0 {
			bigBuf = make([]byte, 40<<10)
		}
		if i%512 == 0 {
			runtime.GC()
		}
	}
}

func threadCPU() string {
	b, _ := os.ReadFile("/proc/thread-self/schedstat")
	return string(b[:len(b)-1])
}

func processCPU() int64 {
	var u syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &u) != nil {
		return 0
	}
	return u.Utime.Nano() + u.Stime.Nano()
}

// Called when the work stops, before the profile does (a sampler linked in stops with it).
var workDone = func() {}

// Returns once the process has used `cpu` seconds of CPU since `since` (its processCPU()),
// or `wall` seconds have passed.
func runFor(since int64, cpu, wall float64) {
	deadline := time.Now().Add(time.Duration(wall * float64(time.Second)))
	for cpu <= 0 || float64(processCPU()-since) < cpu*1e9 {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if cpu > 0 && left > 50*time.Millisecond {
			left = 50 * time.Millisecond
		}
		time.Sleep(left)
	}
}

func main() {
	profile := flag.String("cpuprofile", "", "write a CPU profile here")
	seconds := flag.Float64("seconds", 10, "run this long")
	cpuSeconds := flag.Float64("cpu-seconds", 0,
		"stop once the process has used this much CPU (at most -seconds)")
	hz := flag.Int("hz", 100, "CPU profile rate")
	switches := flag.Bool("switches", false,
		"also run the goroutines whose work crosses stack switches (allocating; with cgo, called back from C)")
	flag.Parse()
	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	fmt.Println("ready")
	<-start
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			panic(err)
		}
		// Before StartCPUProfile: it keeps a rate set earlier (and says so on stderr). Above
		// its default 100 Hz Go's profiler loses samples unevenly (its shares drift from the
		// threads' CPU times), so the test keeps the default.
		if *hz != 100 {
			runtime.SetCPUProfileRate(*hz)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			panic(err)
		}
		defer f.Close()
	}
	profiled := processCPU()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	cpu := []string{"", "", "-", "-"}
	go func() { defer wg.Done(); runtime.LockOSThread(); hashWorker(stop); cpu[0] = threadCPU() }()
	go func() { defer wg.Done(); runtime.LockOSThread(); sortAndEncode(stop); cpu[1] = threadCPU() }()
	if *switches {
		wg.Add(2)
		go func() { defer wg.Done(); runtime.LockOSThread(); allocWorker(stop); cpu[2] = threadCPU() }()
		go func() { defer wg.Done(); runtime.LockOSThread(); callbackWorker(stop); cpu[3] = threadCPU() }()
	}
	runFor(profiled, *cpuSeconds, *seconds)
	close(stop)
	wg.Wait()
	workDone()
	profiled = processCPU() - profiled
	if *profile != "" {
		pprof.StopCPUProfile()
	}
	fmt.Printf("cpu hash %s sort %s alloc %s callback %s\n", cpu[0], cpu[1], cpu[2], cpu[3])
	fmt.Printf("process cpu %d\n", profiled)
	fmt.Println("done")
}
