package rota

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// The local fallback contract is clients/conformance/README.md, "Local fallback".
const (
	// shortcutAfter consecutive unreachable picks send the next picks straight to the
	// local fallback ...
	shortcutAfter = 3
	// ... for shortcutFor, before rota is tried again.
	shortcutFor = time.Second
	// stableStream is how long a Watch stream must have lived for its end to reset the
	// reconnect backoff; a server that accepts and at once ends streams (one draining) is
	// then not hammered.
	stableStream = 5 * time.Second
)

// errShortcut is the cause of local picks made during the short-cut, without asking rota.
var errShortcut = &Error{
	Code:        codes.Unavailable,
	Message:     fmt.Sprintf("rota failed %d picks in a row; not asked again for %s", shortcutAfter, shortcutFor),
	Unreachable: true,
}

// outageState is one client's view of rota's availability: the short-cut, and the
// once-per-outage warnings.
type outageState struct {
	mu       sync.Mutex
	now      func() time.Time
	failures int
	until    time.Time
	inOutage bool
}

func newOutageState() *outageState {
	return &outageState{now: time.Now}
}

// shortcut reports whether picks should skip rota for now and go local.
func (o *outageState) shortcut() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failures >= shortcutAfter && o.now().Before(o.until)
}

func (o *outageState) unreachable() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures++
	if o.failures >= shortcutAfter {
		o.until = o.now().Add(shortcutFor)
	}
}

// answered records that rota answered a pick, with an instance or an error of its own.
func (o *outageState) answered(log *slog.Logger) {
	o.mu.Lock()
	recovered := o.inOutage
	o.failures, o.inOutage = 0, false
	o.mu.Unlock()
	if recovered {
		log.Warn("rota answers again; picks are rota's again")
	}
}

func (o *outageState) pickedLocally(ctx context.Context, log *slog.Logger, service string, cause error) {
	o.mu.Lock()
	first := !o.inOutage
	o.inOutage = true
	o.mu.Unlock()
	if first {
		log.WarnContext(ctx, "rota unreachable; picking followed services locally from the last lists seen",
			"service", service, "error", cause)
	}
}

// Follow keeps a local copy of service's instance list, fed by a background Watch that
// reconnects with backoff, so that Pick can answer from it while rota is unreachable.
// The watch lasts as long as the client. Follow waits, within ctx, for the first complete
// list; when ctx ends first it returns the context's error and the watch goes on.
// Following a service that does not exist yet is allowed.
func (c *Client) Follow(ctx context.Context, service string) error {
	if c.closed() {
		return errClosed
	}
	view := c.follow(service)
	select {
	case <-view.ready:
		return nil
	case <-c.ctx.Done():
		return errClosed
	case <-ctx.Done():
		return contextError(ctx, "waiting for the instance list of "+service)
	}
}

// follow starts the watcher of service unless it runs already.
func (c *Client) follow(service string) *serviceView {
	view, started := c.cache.view(service)
	if !started {
		c.wg.Add(1)
		go c.watch(service)
	}
	return view
}

// watch mirrors service into the cache until the client closes. The cache keeps the last
// list seen while the stream is down.
func (c *Client) watch(service string) {
	defer c.wg.Done()
	for attempt := 0; ; attempt++ {
		opened := time.Now()
		synced, err := c.watchOnce(service)
		if c.ctx.Err() != nil {
			return
		}
		if time.Since(opened) >= stableStream {
			attempt = 0
		}
		if synced {
			c.log.Info("rota watch lost; keeping the last instance list", "service", service, "error", err)
		} else {
			c.log.Debug("rota watch failed", "service", service, "attempt", attempt+1, "error", err)
		}
		if !sleep(c.ctx, c.retryDelay(attempt)) {
			return
		}
	}
}

// watchOnce runs one Watch stream; synced reports whether it delivered a snapshot.
func (c *Client) watchOnce(service string) (synced bool, err error) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	stream, err := c.registry.Watch(ctx, &rotapb.WatchRequest{Service: service})
	if err != nil {
		return false, err
	}
	for {
		event, err := stream.Recv()
		if err != nil {
			return synced, err
		}
		if event.GetSnapshot() != nil {
			synced = true
			c.outage.answered(c.log) // rota is reachable again
		}
		c.cache.apply(service, event)
	}
}

// fallbackCache holds the instance lists of followed services and the round-robin counters
// of local picks.
type fallbackCache struct {
	mu       sync.Mutex
	services map[string]*serviceView
	// counters holds the next local ticket per service and subset ("" for the instances
	// with no version).
	counters map[[2]string]uint64
}

type serviceView struct {
	// ready is closed once the first snapshot has arrived.
	ready     chan struct{}
	synced    bool
	instances []Instance // ordered by id
	epoch     uint64
}

func newFallbackCache() *fallbackCache {
	return &fallbackCache{services: map[string]*serviceView{}, counters: map[[2]string]uint64{}}
}

// view returns the view of service, creating it when absent; existed says whether it was
// already there.
func (fc *fallbackCache) view(service string) (view *serviceView, existed bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if v, ok := fc.services[service]; ok {
		return v, true
	}
	v := &serviceView{ready: make(chan struct{})}
	fc.services[service] = v
	return v, false
}

// apply updates the copy of service with one Watch event.
func (fc *fallbackCache) apply(service string, event *rotapb.WatchEvent) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	v, ok := fc.services[service]
	if !ok {
		v = &serviceView{ready: make(chan struct{})}
		fc.services[service] = v
	}
	switch e := event.GetEvent().(type) {
	case *rotapb.WatchEvent_Snapshot:
		// A rota that has not seen the service since it started (epoch 0) knows less than
		// this copy: its empty list never replaces a non-empty one.
		if len(e.Snapshot.GetInstances()) > 0 || event.GetEpoch() > 0 || len(v.instances) == 0 {
			v.instances = v.instances[:0]
			for _, pb := range e.Snapshot.GetInstances() {
				v.instances = append(v.instances, instanceFromProto(pb))
			}
			slices.SortFunc(v.instances, func(a, b Instance) int { return strings.Compare(a.ID, b.ID) })
		}
		if !v.synced {
			v.synced = true
			close(v.ready)
		}
	case *rotapb.WatchEvent_Added:
		v.upsert(instanceFromProto(e.Added))
	case *rotapb.WatchEvent_Updated:
		v.upsert(instanceFromProto(e.Updated))
	case *rotapb.WatchEvent_Removed:
		v.instances = slices.DeleteFunc(v.instances, func(i Instance) bool { return i.ID == e.Removed.GetId() })
	default:
		return
	}
	v.epoch = event.GetEpoch()
}

func (v *serviceView) upsert(instance Instance) {
	i, found := slices.BinarySearchFunc(v.instances, instance.ID, func(i Instance, id string) int {
		return strings.Compare(i.ID, id)
	})
	if found {
		v.instances[i] = instance
	} else {
		v.instances = slices.Insert(v.instances, i, instance)
	}
}

// synced reports whether service is followed and its first list has arrived.
func (fc *fallbackCache) synced(service string) bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	v, ok := fc.services[service]
	return ok && v.synced
}

// pick chooses, round robin, an up instance of service from the cached list, with the
// version isolation rota applies: version v picks among instances of version v, or when
// there are none among the instances with no version (and says so in Fallback); no
// version picks among the instances with no version. As rota's round robin, ticket t takes
// position t mod k among the k instances of that subset that are not excluded; a subset that
// is empty or all excluded gives nothing (never another subset).
func (fc *fallbackCache) pick(service, version string, exclude []string) (*Pick, bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	v, ok := fc.services[service]
	if !ok || !v.synced {
		return nil, false
	}
	subset, fallback := v.subset(version)
	var accepted []Instance
	for _, candidate := range subset {
		if !slices.Contains(exclude, candidate.ID) {
			accepted = append(accepted, candidate)
		}
	}
	if len(accepted) == 0 {
		return nil, false
	}
	label := version
	if fallback != "" {
		label = ""
	}
	key := [2]string{service, label}
	ticket := fc.counters[key]
	fc.counters[key] = ticket + 1
	chosen := accepted[ticket%uint64(len(accepted))]
	return &Pick{
		Instance:      chosen,
		Ticket:        ticket,
		Rule:          "round_robin",
		Fallback:      fallback,
		Epoch:         v.epoch,
		LocalFallback: true,
	}, true
}

// subset returns a fresh slice of the eligible instances serving version.
func (v *serviceView) subset(version string) (subset []Instance, fallback string) {
	of := func(version string) []Instance {
		var out []Instance
		for _, i := range v.instances {
			if i.eligible() && i.Version == version {
				out = append(out, i)
			}
		}
		return out
	}
	if version != "" {
		if subset := of(version); len(subset) > 0 {
			return subset, ""
		}
		fallback = fmt.Sprintf("no instance with version %q; picked from instances with no version", version)
	}
	return of(""), fallback
}
