package rota

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

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
		synced, err := c.watchOnce(service)
		if c.ctx.Err() != nil {
			return
		}
		if synced {
			attempt = 0
			c.log.Warn("rota watch lost; keeping the last instance list", "service", service, "error", err)
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
		v.instances = v.instances[:0]
		for _, pb := range e.Snapshot.GetInstances() {
			v.instances = append(v.instances, instanceFromProto(pb))
		}
		slices.SortFunc(v.instances, func(a, b Instance) int { return strings.Compare(a.ID, b.ID) })
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

// pick chooses, round robin, an up instance of service from the cached list, with the
// version isolation rota applies: version v picks among instances of version v, or when
// there are none among the instances with no version (and says so in Fallback); no
// version picks among the instances with no version. Excluded ids are never returned.
func (fc *fallbackCache) pick(service, version string, exclude []string) (*Pick, bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	v, ok := fc.services[service]
	if !ok || !v.synced {
		return nil, false
	}
	subset, fallback := v.subset(version)
	candidates := slices.DeleteFunc(subset, func(i Instance) bool { return slices.Contains(exclude, i.ID) })
	if len(candidates) == 0 {
		return nil, false
	}
	label := version
	if fallback != "" {
		label = ""
	}
	key := [2]string{service, label}
	ticket := fc.counters[key]
	fc.counters[key] = ticket + 1
	return &Pick{
		Instance:      candidates[ticket%uint64(len(candidates))],
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
