package drill

import "syscall"

// childAttr makes the kernel kill a child when the drill dies, so that a
// drill killed outright (SIGKILL, a crashed test) leaves no redis-server or
// sluiced behind; its own exit paths stop them first.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
