//go:build unix

package boltbacklog

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A read of a mapped file past its end (what bbolt does on a truncated
// file) faults; guarded returns it as an error instead of a crash.
func TestGuardedTurnsAFaultIntoAnError(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "short"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(os.Getpagesize())); err != nil {
		t.Fatal(err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, 4*os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(data)
	var b byte
	err = guarded(func() error {
		b = data[2*os.Getpagesize()] // past the file's end: SIGBUS
		return nil
	})
	if !errors.Is(err, errPanicked) {
		t.Fatalf("guarded read past the mapped file's end = %v (read %d); want errPanicked", err, b)
	}
}
