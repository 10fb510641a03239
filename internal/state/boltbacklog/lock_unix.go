//go:build unix

package boltbacklog

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockFile takes f's exclusive flock, trying every 50 ms until timeout.
// bbolt locks the same open file again at Open, which a lock already
// held through that open file grants at once.
func lockFile(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return err
		case time.Now().After(deadline):
			return errLockTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}
