package xds

import (
	"os"
	"runtime"
	"testing"
)

func TestMain(m *testing.M) {
	if os.Getenv(consumerEnv) != "" {
		os.Exit(consumerMain())
	}
	// Servers and consumers die with the test process (parent-death signal, tied to the
	// starting thread).
	runtime.LockOSThread()
	os.Exit(m.Run())
}
