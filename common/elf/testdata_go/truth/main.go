// Prints what Go's own debug/gosym reads from a Go binary's .gopclntab, for the parser's
// tests: one line per function "F entry end name", then for a few pcs of each function
// "L pc file line".
package main

import (
	"debug/elf"
	"debug/gosym"
	"fmt"
	"os"
)

func main() {
	f, err := elf.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sect := f.Section(".gopclntab")
	if sect == nil {
		sect = f.Section(".data.rel.ro.gopclntab")
	}
	data, err := sect.Data()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	text := f.Section(".text").Addr
	table, err := gosym.NewTable(nil, gosym.NewLineTable(data, text))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, fn := range table.Funcs {
		fmt.Printf("F %#x %#x %s\n", fn.Entry, fn.End, fn.Name)
		for _, pc := range []uint64{fn.Entry, fn.Entry + (fn.End-fn.Entry)/2} {
			file, line, _ := table.PCToLine(pc)
			fmt.Printf("L %#x %s %d\n", pc, file, line)
		}
	}
}
