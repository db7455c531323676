package rota

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// TestGeneratedCodeIsCurrent compiles ../../proto/rota/v1/rota.proto and compares it with
// the descriptor embedded in rotapb: they differ when the proto changed and `go generate`
// was not run.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: []string{filepath.Join("..", "..", "proto")},
		}),
	}
	files, err := compiler.Compile(context.Background(), "rota/v1/rota.proto")
	if err != nil {
		t.Fatal(err)
	}
	fromSource := protodesc.ToFileDescriptorProto(files[0])
	generated := protodesc.ToFileDescriptorProto(rotapb.File_rota_v1_rota_proto)
	if !proto.Equal(fromSource, generated) {
		t.Fatalf("rotapb/ is stale: run `go generate` in clients/go\n--- compiled from the proto:\n%s\n--- embedded in rotapb:\n%s",
			prototext.Format(fromSource), prototext.Format(generated))
	}
}
