package channel

// The echo service's generated code in echopb/ is committed. Regenerate it after a change to
// ../../conformance/channel/echo.proto with `go generate` in this folder, as for ../rotapb.

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
