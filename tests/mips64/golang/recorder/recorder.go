//go:build cgo

// Starts the sampler of recorder.c when STRATA_GO_RECORD names its output file: it samples
// from the SIGUSR1 that starts the workload's work and its own profile until the work stops
// (at most STRATA_GO_RECORD_SECONDS), at STRATA_GO_RECORD_HZ per thread's CPU second.

package main

// int strata_recorder_init(const char* path, int hz);
// void strata_recorder_start(void);
// long strata_recorder_stop(void);
// int strata_recorder_threads(void);
// int strata_recorder_timer_failures(void);
// int strata_recorder_overruns(void);
import "C"

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func init() {
	path := os.Getenv("STRATA_GO_RECORD")
	if path == "" {
		return
	}
	hz, _ := strconv.Atoi(os.Getenv("STRATA_GO_RECORD_HZ"))
	seconds, err := strconv.ParseFloat(os.Getenv("STRATA_GO_RECORD_SECONDS"), 64)
	if err != nil {
		panic("STRATA_GO_RECORD_SECONDS: " + err.Error())
	}
	// Runs after the runtime installed its signal handlers: this one stays.
	if C.strata_recorder_init(C.CString(path), C.int(hz)) != 0 {
		panic("the recorder did not start")
	}
	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	workDone = func() {
		close(done)
		<-stopped // reported before the workload prints its own lines
	}
	go func() {
		<-start
		C.strata_recorder_start()
		select {
		case <-time.After(time.Duration(seconds * float64(time.Second))):
		case <-done:
		}
		n := int64(C.strata_recorder_stop())
		fmt.Printf("recorded %d samples of %d threads (%d timers not created, %d expirations merged)\n",
			n, int(C.strata_recorder_threads()), int(C.strata_recorder_timer_failures()),
			int(C.strata_recorder_overruns()))
		close(stopped)
	}()
}
