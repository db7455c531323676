package rota

// The generated code in rotapb/ is committed. Regenerate it after a change to
// ../../proto/rota/v1/rota.proto with `go generate` in this folder: buf and the protoc-gen-go
// and protoc-gen-go-grpc plugins (pinned in buf.gen.yaml) are built from the Go module proxy.
// TestGeneratedCodeIsCurrent fails while rotapb/ is stale.

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
