//go:build !unix

package boltbacklog

import (
	"os"
	"time"
)

// lockFile takes no lock here: bbolt's own lock, taken at Open, keeps a
// second process out, after the file's verification.
func lockFile(*os.File, time.Duration) error { return nil }
