package rota

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

func TestVersionContext(t *testing.T) {
	ctx := context.Background()
	if v := VersionFrom(ctx); v != "" {
		t.Errorf("VersionFrom(background) = %q, want none", v)
	}
	ctx = WithVersion(ctx, "zlt")
	if v := VersionFrom(ctx); v != "zlt" {
		t.Errorf("VersionFrom = %q, want zlt", v)
	}
	if v := VersionFrom(WithVersion(ctx, "bob")); v != "bob" {
		t.Errorf("VersionFrom after a second WithVersion = %q, want bob", v)
	}
}

func TestMiddlewareReadsTheHeader(t *testing.T) {
	var seen []string
	handler := Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		seen = append(seen, VersionFrom(r.Context()))
	}))
	withHeader := httptest.NewRequest(http.MethodGet, "/", nil)
	withHeader.Header.Set("x-rota-version", "zlt") // header names are case-insensitive
	handler.ServeHTTP(httptest.NewRecorder(), withHeader)
	handler.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	if want := []string{"zlt", ""}; !slices.Equal(seen, want) {
		t.Errorf("versions seen %q, want %q", seen, want)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestVersionTransportForwardsTheContextVersion(t *testing.T) {
	var sent []string
	transport := VersionTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r.Header.Get(VersionHeader))
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
	}))
	do := func(ctx context.Context, header string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1/", nil)
		if header != "" {
			req.Header.Set(VersionHeader, header)
		}
		resp, err := transport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if req.Header.Get(VersionHeader) != header {
			t.Error("the transport modified the caller's request")
		}
	}
	do(WithVersion(context.Background(), "zlt"), "")
	do(context.Background(), "")
	do(WithVersion(context.Background(), "zlt"), "explicit")
	if want := []string{"zlt", "", "explicit"}; !slices.Equal(sent, want) {
		t.Errorf("headers sent %q, want %q", sent, want)
	}
}

// TestVersionFollowsTheCallChain: an HTTP request carrying X-Rota-Version reaches a handler
// that picks without naming a version, then calls a gRPC service through the client
// interceptors; rota and the gRPC service both see the version.
func TestVersionFollowsTheCallChain(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	fake := &fakeRota{pickFunc: func(req *rotapb.PickRequest) (*rotapb.PickResponse, error) {
		return &rotapb.PickResponse{Instance: &rotapb.Instance{Id: "v-" + req.GetVersion(), Service: req.GetService()}}, nil
	}}
	rotaAddr, _ := serveFake(t, fake)
	client := dial(t, rotaAddr)

	// The downstream gRPC service (the fake again), behind the version interceptors.
	downstream := &fakeRota{pickFunc: fake.pickFunc}
	downAddr, _ := serveFake(t, downstream,
		grpc.ChainUnaryInterceptor(UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(StreamServerInterceptor()))
	conn, err := grpc.NewClient(downAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(StreamClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stub := rotapb.NewBalancerClient(conn)

	edge := httptest.NewServer(Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := client.Pick(r.Context(), "svc")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if _, err := stub.Pick(r.Context(), &rotapb.PickRequest{Service: "downstream"}); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		stream, err := stub.PickStream(r.Context())
		if err == nil {
			err = stream.Send(&rotapb.PickRequest{Service: "downstream-stream"})
		}
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		_ = stream.CloseSend()
		_, _ = io.WriteString(w, p.Instance.ID)
	})))
	defer edge.Close()

	get := func(version string) string {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, edge.URL, nil)
		if version != "" {
			req.Header.Set(VersionHeader, version)
		}
		resp, err := edge.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("edge answered %d: %s", resp.StatusCode, body)
		}
		return string(body)
	}
	if got := get("zlt"); got != "v-zlt" {
		t.Errorf("with X-Rota-Version zlt the pick returned %q, want v-zlt", got)
	}
	if got := get(""); got != "v-" {
		t.Errorf("without a version the pick returned %q, want v-", got)
	}
	_, downVersions, _ := downstream.recorded()
	if want := []string{"zlt", "zlt", "", ""}; !slices.Equal(downVersions, want) {
		t.Errorf("downstream saw versions %q, want %q", downVersions, want)
	}
}

func TestExplicitVersionOverridesTheContext(t *testing.T) {
	ctx := testContext(t, 10*time.Second)
	fake := &fakeRota{pickFunc: func(req *rotapb.PickRequest) (*rotapb.PickResponse, error) {
		return &rotapb.PickResponse{Instance: &rotapb.Instance{Id: "x"}}, nil
	}}
	addr, _ := serveFake(t, fake)
	c := dial(t, addr)
	zlt := WithVersion(ctx, "zlt")
	for _, opts := range [][]PickOption{nil, {Version("bob")}, {Version("")}} {
		if _, err := c.Pick(zlt, "svc", opts...); err != nil {
			t.Fatal(err)
		}
	}
	picks, _, _ := fake.recorded()
	var versions []string
	for _, p := range picks {
		versions = append(versions, p.GetVersion())
	}
	if want := []string{"zlt", "bob", ""}; !slices.Equal(versions, want) {
		t.Errorf("versions sent %q, want %q", versions, want)
	}
}

func TestClientInterceptorKeepsExplicitMetadata(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(WithVersion(context.Background(), "zlt"), VersionMetadataKey, "mine")
	md, _ := metadata.FromOutgoingContext(outgoingVersion(ctx))
	if got := md.Get(VersionMetadataKey); !slices.Equal(got, []string{"mine"}) {
		t.Errorf("metadata %q, want only the caller's", got)
	}
}
