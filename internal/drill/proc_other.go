//go:build !linux

package drill

import "syscall"

// childAttr is nil where there is no parent-death signal: the drill's exit
// paths (Close, and the command's signal handling) stop the children.
func childAttr() *syscall.SysProcAttr { return nil }
