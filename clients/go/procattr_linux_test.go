package rota

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal kills the server if the test binary dies without cleaning up.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
