//go:build !linux

package rotaproc

import "os/exec"

// SetParentDeathSignal does nothing here: the parent-death signal is Linux's.
func SetParentDeathSignal(*exec.Cmd) {}
