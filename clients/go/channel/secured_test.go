package channel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	rota "github.com/rota-lb/rota/clients/go"
	"github.com/rota-lb/rota/clients/go/channel/echo"
	"github.com/rota-lb/rota/clients/go/internal/rotaproc"
)

// bearerToken sends `authorization: Bearer TOKEN` with every call, over TLS only.
type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return true }

// testPKI is a CA, a server certificate for localhost and 127.0.0.1, and a client certificate,
// written as PEM files in a directory of the test.
type testPKI struct {
	dir                   string
	roots                 *x509.CertPool
	server, client        tls.Certificate
	caFile                string
	serverCert, serverKey string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), roots: x509.NewCertPool()}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rota go test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.roots.AddCert(ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (tls.Certificate, string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: dns, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile := p.write(t, name+".pem", "CERTIFICATE", der)
		keyFile := p.write(t, name+".key", "PRIVATE KEY", keyDER)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return pair, certFile, keyFile
	}
	p.server, p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.client, _, _ = leaf(3, "client", x509.ExtKeyUsageClientAuth, nil, nil)
	return p
}

func (p *testPKI) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// dialOptions reach rota over TLS trusting the test CA, with the client certificate when
// withCertificate, sending token.
func (p *testPKI) dialOptions(token string, withCertificate bool) []grpc.DialOption {
	config := &tls.Config{RootCAs: p.roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCertificate {
		config.Certificates = []tls.Certificate{p.client}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(config)), grpc.WithPerRPCCredentials(bearerToken(token))}
}

// A rota with a token and mTLS: the client and the rota:/// channel reach it with the dial
// options of the docs, and a wrong token fails with rota's own message.
func TestTokenAndMutualTLS(t *testing.T) {
	const token = "go-channel-token-0123456789"
	pki := newTestPKI(t)
	tokenFile := filepath.Join(pki.dir, "token")
	config := filepath.Join(pki.dir, "rota.toml")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth := fmt.Sprintf("[[auth.tokens]]\nname = \"go-suite\"\ntoken_file = %q\nscopes = [\"pick\", \"register:*\"]\n", tokenFile)
	if err := os.WriteFile(config, []byte(auth), 0o600); err != nil {
		t.Fatal(err)
	}
	proc, err := rotaproc.StartWith(rotaproc.Binary(filepath.Join("..", "..", "..")), "127.0.0.1:0", rotaproc.Options{
		Args: []string{"--config", config, "--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--tls-client-ca", pki.caFile},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Stop)
	ctx := testContext(t, time.Minute)

	client, err := rota.Dial(ctx, proc.Addr, rota.WithLogger(quietLogger()), rota.WithDialOptions(pki.dialOptions(token, true)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, id := range []string{"a", "b"} {
		srv, err := echo.Start(id, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Kill)
		if _, err := client.Register(ctx, rota.Instance{ID: id, Service: "secured", Host: "127.0.0.1", Port: uint32(srv.Addr.Port)}); err != nil {
			t.Fatal(err)
		}
	}
	if pick, err := client.Pick(ctx, "secured"); err != nil || (pick.Instance.ID != "a" && pick.Instance.ID != "b") {
		t.Fatalf("pick over mTLS with the token: %+v, %v", pick, err)
	}

	call := func(token string) []echo.Result {
		resolver := NewResolver(WithServer(proc.Addr), WithLogger(quietLogger()), WithRotaDialOptions(pki.dialOptions(token, true)...))
		conn, err := grpc.NewClient("rota:///secured", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return echo.Calls(ctx, conn, 10, "", 10*time.Second)
	}
	answered := map[string]int{}
	for _, r := range call(token) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		answered[r.Instance]++
	}
	if answered["a"] != 5 || answered["b"] != 5 {
		t.Fatalf("10 calls through the channel answered %v, want 5 each", answered)
	}

	wrong := call("not-the-token-0123456789")
	if err := wrong[0].Err; status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "the token is not valid") {
		t.Fatalf("a wrong token: %v, want UNAVAILABLE naming rota's refusal", err)
	}
	other, err := rota.Dial(ctx, proc.Addr, rota.WithLogger(quietLogger()), rota.WithDialOptions(pki.dialOptions("not-the-token-0123456789", true)...))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Pick(ctx, "secured"); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "the token is not valid") {
		t.Fatalf("a pick with a wrong token: %v, want UNAUTHENTICATED: the token is not valid", err)
	}
}
