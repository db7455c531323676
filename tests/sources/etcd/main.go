// Command etcd-endpoints registers gRPC endpoints in etcd the way a Go service does with
// go.etcd.io/etcd/client/v3/naming/endpoints, driven one command a line on standard input for
// rota's etcd source tests. Each command is answered by one line on standard output, starting
// with "ok" or "err"; diagnostics go to standard error.
//
//	add TARGET KEY ADDR TTL [METADATA_JSON]  lease of TTL s (0: no lease), kept alive; AddEndpoint(TARGET/KEY)
//	gozero KEY PREFIX ADDR TTL               go-zero's discov layout: PREFIX/<lease id> = ADDR, kept alive
//	del TARGET KEY                           DeleteEndpoint(TARGET/KEY); its keepalive stops
//	stopkeepalive KEY                        stop renewing KEY's lease: it expires after its TTL
//	revoke KEY                               revoke KEY's lease now (its key is deleted)
//	rev                                      current revision of the store
//	compact REV                              compact the store up to REV (physical)
//	quit                                     close the client and exit (leases left to expire)
//
// End of input is quit. KEY names a registration for the later commands, as given to add or
// gozero.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
)

// registration is one key written by add or gozero and the lease that holds it.
type registration struct {
	key   string // the full etcd key
	lease clientv3.LeaseID
	stop  context.CancelFunc // stops the keepalive; nil when there is none
}

type driver struct {
	cli     *clientv3.Client
	timeout time.Duration
	regs    map[string]*registration
}

func main() {
	eps := flag.String("endpoints", "127.0.0.1:2379", "etcd client endpoints, comma-separated")
	dialTimeout := flag.Duration("dial-timeout", 5*time.Second, "timeout to connect to etcd")
	timeout := flag.Duration("timeout", 5*time.Second, "timeout of each command")
	flag.Parse()
	log.SetPrefix("etcd-endpoints: ")
	log.SetFlags(0)

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*eps, ","),
		DialTimeout: *dialTimeout,
	})
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	d := &driver{cli: cli, timeout: *timeout, regs: map[string]*registration{}}
	defer d.close()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 1024*1024)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		if line == "quit" {
			fmt.Println("ok")
			return
		}
		answer, err := d.run(line)
		if err != nil {
			fmt.Println("err " + oneLine(err.Error()))
			continue
		}
		if answer == "" {
			fmt.Println("ok")
		} else {
			fmt.Println("ok " + answer)
		}
	}
	if err := in.Err(); err != nil {
		log.Printf("stdin: %v", err)
	}
}

func (d *driver) close() {
	for _, r := range d.regs {
		if r.stop != nil {
			r.stop()
		}
	}
	if err := d.cli.Close(); err != nil {
		log.Printf("close: %v", err)
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// fields splits line into n whitespace-separated fields, the last one keeping the rest of the
// line (so METADATA_JSON may hold spaces); fewer fields when the line has fewer.
func fields(line string, n int) []string {
	var out []string
	rest := strings.TrimSpace(line)
	for len(out) < n-1 && rest != "" {
		i := strings.IndexAny(rest, " \t")
		if i < 0 {
			break
		}
		out = append(out, rest[:i])
		rest = strings.TrimSpace(rest[i:])
	}
	if rest != "" {
		out = append(out, rest)
	}
	return out
}

func (d *driver) run(line string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	cmd := fields(line, 2)[0]
	switch cmd {
	case "add":
		f := fields(line, 6)
		if len(f) < 5 {
			return "", errors.New("usage: add TARGET KEY ADDR TTL [METADATA_JSON]")
		}
		return d.add(ctx, f[1], f[2], f[3], f[4], f[5:])
	case "gozero":
		f := strings.Fields(line)
		if len(f) != 5 {
			return "", errors.New("usage: gozero KEY PREFIX ADDR TTL")
		}
		return d.gozero(ctx, f[1], f[2], f[3], f[4])
	case "del":
		f := strings.Fields(line)
		if len(f) != 3 {
			return "", errors.New("usage: del TARGET KEY")
		}
		return d.del(ctx, f[1], f[2])
	case "stopkeepalive":
		f := strings.Fields(line)
		if len(f) != 2 {
			return "", errors.New("usage: stopkeepalive KEY")
		}
		r, ok := d.regs[f[1]]
		if !ok {
			return "", fmt.Errorf("no registration %q", f[1])
		}
		if r.stop == nil {
			return "", fmt.Errorf("%q has no keepalive", f[1])
		}
		r.stop()
		r.stop = nil
		return fmt.Sprintf("lease=%x", int64(r.lease)), nil
	case "revoke":
		f := strings.Fields(line)
		if len(f) != 2 {
			return "", errors.New("usage: revoke KEY")
		}
		r, ok := d.regs[f[1]]
		if !ok {
			return "", fmt.Errorf("no registration %q", f[1])
		}
		if r.lease == clientv3.NoLease {
			return "", fmt.Errorf("%q has no lease", f[1])
		}
		if r.stop != nil {
			r.stop()
			r.stop = nil
		}
		resp, err := d.cli.Revoke(ctx, r.lease)
		if err != nil {
			return "", err
		}
		delete(d.regs, f[1])
		return fmt.Sprintf("rev=%d", resp.Header.Revision), nil
	case "rev":
		resp, err := d.cli.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			return "", err
		}
		return strconv.FormatInt(resp.Header.Revision, 10), nil
	case "compact":
		f := strings.Fields(line)
		if len(f) != 2 {
			return "", errors.New("usage: compact REV")
		}
		rev, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return "", fmt.Errorf("bad revision %q", f[1])
		}
		resp, err := d.cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("rev=%d", resp.Header.Revision), nil
	default:
		return "", fmt.Errorf("unknown command %q", cmd)
	}
}

// lease grants a lease of ttl seconds and keeps it alive until the returned stop is called;
// ttl "0" means no lease.
func (d *driver) lease(ctx context.Context, ttl string) (clientv3.LeaseID, context.CancelFunc, error) {
	secs, err := strconv.ParseInt(ttl, 10, 64)
	if err != nil || secs < 0 {
		return clientv3.NoLease, nil, fmt.Errorf("bad TTL %q", ttl)
	}
	if secs == 0 {
		return clientv3.NoLease, nil, nil
	}
	grant, err := d.cli.Grant(ctx, secs)
	if err != nil {
		return clientv3.NoLease, nil, err
	}
	kctx, stop := context.WithCancel(context.Background())
	ch, err := d.cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		stop()
		return clientv3.NoLease, nil, err
	}
	go func() {
		for range ch {
		}
		if kctx.Err() == nil {
			log.Printf("keepalive of lease %x ended", int64(grant.ID))
		}
	}()
	return grant.ID, stop, nil
}

func (d *driver) remember(name, key string, lease clientv3.LeaseID, stop context.CancelFunc) {
	if old, ok := d.regs[name]; ok && old.stop != nil {
		old.stop()
	}
	d.regs[name] = &registration{key: key, lease: lease, stop: stop}
}

func (d *driver) add(ctx context.Context, target, key, addr, ttl string, meta []string) (string, error) {
	var metadata any
	if len(meta) == 1 {
		if err := json.Unmarshal([]byte(meta[0]), &metadata); err != nil {
			return "", fmt.Errorf("bad METADATA_JSON: %v", err)
		}
	}
	em, err := endpoints.NewManager(d.cli, target)
	if err != nil {
		return "", err
	}
	id, stop, err := d.lease(ctx, ttl)
	if err != nil {
		return "", err
	}
	var opts []clientv3.OpOption
	if id != clientv3.NoLease {
		opts = append(opts, clientv3.WithLease(id))
	}
	full := target + "/" + key
	if err := em.AddEndpoint(ctx, full, endpoints.Endpoint{Addr: addr, Metadata: metadata}, opts...); err != nil {
		if stop != nil {
			stop()
			_, _ = d.cli.Revoke(context.Background(), id)
		}
		return "", err
	}
	d.remember(key, full, id, stop)
	return fmt.Sprintf("key=%s lease=%x", full, int64(id)), nil
}

// gozero writes what go-zero's core/discov Publisher writes: the key PREFIX/<lease id in
// decimal> with the plain address as its value, under a kept-alive lease.
func (d *driver) gozero(ctx context.Context, name, prefix, addr, ttl string) (string, error) {
	id, stop, err := d.lease(ctx, ttl)
	if err != nil {
		return "", err
	}
	if id == clientv3.NoLease {
		return "", errors.New("gozero needs a TTL above 0")
	}
	full := fmt.Sprintf("%s/%d", prefix, int64(id))
	if _, err := d.cli.Put(ctx, full, addr, clientv3.WithLease(id)); err != nil {
		stop()
		_, _ = d.cli.Revoke(context.Background(), id)
		return "", err
	}
	d.remember(name, full, id, stop)
	return fmt.Sprintf("key=%s lease=%x", full, int64(id)), nil
}

func (d *driver) del(ctx context.Context, target, key string) (string, error) {
	em, err := endpoints.NewManager(d.cli, target)
	if err != nil {
		return "", err
	}
	full := target + "/" + key
	if err := em.DeleteEndpoint(ctx, full); err != nil {
		return "", err
	}
	if r, ok := d.regs[key]; ok && r.key == full {
		if r.stop != nil {
			r.stop()
		}
		delete(d.regs, key)
	}
	return "key=" + full, nil
}
