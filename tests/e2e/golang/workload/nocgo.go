//go:build !cgo

package main

func cgoWork() {}
