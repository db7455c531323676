//go:build !linux

package rota

import "os/exec"

func setParentDeathSignal(*exec.Cmd) {}
