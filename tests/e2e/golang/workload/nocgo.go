//go:build !cgo

package main

func cgoWork() {}

// Without cgo there is no C to call back from.
func callbackWorker(stop <-chan struct{}) {}
