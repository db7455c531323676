package rotaproc

import (
	"os/exec"
	"syscall"
)

// SetParentDeathSignal has the process cmd starts killed (SIGKILL) when the thread that
// started it exits (Linux; elsewhere it does nothing): a server or a consumer process dies with
// its test binary even when that one crashes.
func SetParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
