package channel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

const (
	// MinLease and MaxLease bound the tickets of one lease (rota accepts at most 65,536).
	MinLease = 1
	MaxLease = 65536
	// leaseTarget is how long one lease should last at the measured RPC rate: long enough that
	// leases cost little, short enough that a new instance list is picked up quickly.
	leaseTarget = 75 * time.Millisecond
	// initialLease is the size of a version's first lease, before any rate is known.
	initialLease = 16
	// MaxVersions bounds the versions with a lease stream of their own; the least recently
	// used one is dropped (with its unused tickets) to make room.
	MaxVersions = 32
	// leaseTimeout bounds one Lease call.
	leaseTimeout = 3 * time.Second
	// errorRetry is how long a refusal by rota (e.g. no eligible instance) answers RPCs before
	// the next attempt.
	errorRetry = 500 * time.Millisecond
)

// leaseView is one lease's instance list with its ticket map.
type leaseView struct {
	rule    string
	ids     []string
	addrs   []string
	weights []uint64
	m       *ticketMap
}

func (v *leaseView) same(o *leaseView) bool {
	if v == nil || o == nil || v.rule != o.rule || len(v.ids) != len(o.ids) {
		return false
	}
	for i := range v.ids {
		if v.ids[i] != o.ids[i] || v.addrs[i] != o.addrs[i] || v.weights[i] != o.weights[i] {
			return false
		}
	}
	return true
}

// block is one lease, of which used draws are spent: either a run of tickets first ..
// first+count-1, mapped locally over view, or (picks set) rota's own picks, the i-th going to
// view position picks[i] with tickets[i]: a lease without a version of a service under gray
// release, whose version rota chooses per pick.
type block struct {
	first   uint64
	count   uint32
	used    uint32
	view    *leaseView
	picks   []int
	tickets []uint64
}

// draw is one ticket for one RPC.
type draw struct {
	ticket uint64
	view   *leaseView
	local  bool // from the local rotation (rota unreachable)
	// picked: rota chose the instance, view position pos (a pick of a picks block, or its
	// replay by the local rotation); otherwise the ticket is mapped by view.m.
	picked bool
	pos    int
}

// leaser holds the lease streams of one channel, one per version in use.
type leaser struct {
	link *link
	rule string
	// wake republishes the picker, so that RPCs queued for a lease are picked again.
	wake func()
	// local returns the view to rotate over when rota is unreachable and no lease was seen.
	local func(version string) *leaseView

	closed atomic.Bool

	mu      sync.RWMutex
	streams map[string]*versionStream
	gen     uint64
}

func newLeaser(l *link, rule string, wake func(), local func(string) *leaseView) *leaser {
	return &leaser{link: l, rule: rule, wake: wake, local: local, streams: map[string]*versionStream{}}
}

// stream returns the version's stream, making room when MaxVersions are in use.
func (ls *leaser) stream(version string) *versionStream {
	ls.mu.RLock()
	s, ok := ls.streams[version]
	ls.mu.RUnlock()
	if ok {
		return s
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if s, ok := ls.streams[version]; ok {
		return s
	}
	if len(ls.streams) >= MaxVersions {
		var oldest *versionStream
		for _, c := range ls.streams {
			if oldest == nil || c.lastUse().Before(oldest.lastUse()) {
				oldest = c
			}
		}
		delete(ls.streams, oldest.version)
	}
	s = &versionStream{owner: ls, version: version, k: initialLease, gen: ls.gen}
	ls.streams[version] = s
	return s
}

// invalidate drops every unused ticket after the instance list changed, so that the next
// tickets are mapped over rota's new list.
func (ls *leaser) invalidate() {
	ls.mu.Lock()
	ls.gen++
	gen := ls.gen
	streams := make([]*versionStream, 0, len(ls.streams))
	for _, s := range ls.streams {
		streams = append(streams, s)
	}
	ls.mu.Unlock()
	for _, s := range streams {
		s.reset(gen)
	}
}

func (ls *leaser) close() { ls.closed.Store(true) }

func (ls *leaser) isClosed() bool { return ls.closed.Load() }

// versionStream leases the tickets of one version and hands them out one RPC at a time.
type versionStream struct {
	owner   *leaser
	version string

	mu        sync.Mutex
	cur, next *block
	fetching  bool
	gen       uint64
	k         uint32
	activated time.Time
	used      time.Time
	// last is the newest lease's view, kept for the local rotation while rota is away; when
	// that lease was answered with picks, lastPicks holds their positions, which the local
	// rotation replays in order (keeping rota's last split between versions).
	last      *leaseView
	lastPicks []int
	// offline: leases fail because rota is unreachable; tickets come from localTicket.
	offline     bool
	localTicket uint64
	// refused is rota's own refusal of the last lease, answered until refusedUntil.
	refused      error
	refusedUntil time.Time
	waiting      bool
	attempt      int
}

func (s *versionStream) lastUse() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func (s *versionStream) reset(gen uint64) {
	s.mu.Lock()
	s.gen = gen
	s.cur, s.next = nil, nil
	s.refused = nil
	s.mu.Unlock()
}

// take returns the next ticket; ok is false when the RPC must wait for a lease (the picker is
// republished when it arrives), err is set when rota refused the lease.
func (s *versionStream) take() (d draw, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.used = now
	if s.offline {
		view := s.last
		if view == nil {
			view = s.owner.local(s.version)
		}
		if view == nil {
			return draw{}, false, status.Errorf(codes.Unavailable, "rota is unreachable and no instance of %q is known", s.owner.link.service)
		}
		s.localTicket++
		d := draw{ticket: s.localTicket - 1, view: view, local: true}
		if view == s.last && len(s.lastPicks) > 0 {
			d.picked, d.pos = true, s.lastPicks[d.ticket%uint64(len(s.lastPicks))]
		}
		return d, true, nil
	}
	for {
		if s.cur != nil && s.cur.used < s.cur.count {
			b := s.cur
			d := draw{ticket: b.first + uint64(b.used), view: b.view}
			if b.picks != nil {
				d.ticket, d.picked, d.pos = b.tickets[b.used], true, b.picks[b.used]
			}
			b.used++
			// Keep one block ahead: the next lease has the whole of this block's life (about
			// leaseTarget) to arrive, so calls do not wait for it even when rota is slow.
			if s.next == nil && !s.fetching {
				s.startFetch()
			}
			return d, true, nil
		}
		if s.next != nil {
			s.activate(s.next, now)
			s.next = nil
			continue
		}
		if s.refused != nil && now.Before(s.refusedUntil) {
			return draw{}, false, s.refused
		}
		if !s.fetching {
			s.startFetch()
		}
		s.waiting = true
		return draw{}, false, nil
	}
}

// activate makes b the current block and sizes the next lease from the rate at which the
// previous block was spent.
func (s *versionStream) activate(b *block, now time.Time) {
	if prev := s.cur; prev != nil && !s.activated.IsZero() {
		elapsed := now.Sub(s.activated)
		if elapsed <= 0 {
			elapsed = time.Microsecond
		}
		want := float64(prev.count) * float64(leaseTarget) / float64(elapsed)
		// Grow at most 16× per lease, so that a burst does not reserve a huge block.
		want = min(want, float64(s.k)*16)
		s.k = uint32(min(max(want, MinLease), MaxLease))
	}
	s.cur = b
	s.activated = now
}

// startFetch leases s.k tickets in the background. Called with s.mu held.
func (s *versionStream) startFetch() {
	s.fetching = true
	go s.fetch(s.k, s.gen)
}

func (s *versionStream) fetch(count uint32, gen uint64) {
	l := s.owner.link
	ctx, cancel := context.WithTimeout(context.Background(), leaseTimeout)
	var trailer metadata.MD
	resp, err := l.balancer.Lease(ctx, &rotapb.LeaseRequest{
		Service: l.service, Rule: s.owner.rule, Version: s.version, Count: count,
	}, grpc.Trailer(&trailer))
	cancel()
	var view *leaseView
	var b *block
	if err == nil {
		view, err = viewOf(resp)
	}
	if err == nil {
		b, err = blockOf(resp, view)
	}

	s.mu.Lock()
	s.fetching = false
	wake := s.waiting
	s.waiting = false
	retry := time.Duration(0)
	switch {
	case s.owner.isClosed():
	case gen != s.gen:
		// The instance list changed while this lease was in flight: lease again over the new one.
		s.startFetch()
	case err == nil:
		s.attempt = 0
		s.refused = nil
		if s.offline {
			s.offline = false
			if l.goOnline() {
				l.log.Info("rota: leases resumed", "service", l.service)
			}
		}
		if s.last.same(view) {
			b.view = s.last
		}
		s.last, s.lastPicks = b.view, b.picks
		if s.cur == nil || s.cur.used >= s.cur.count {
			s.activate(b, time.Now())
		} else {
			s.next = b
		}
	case trailer.Get("rota-error") != nil || isLocalError(err):
		// rota's own answer (unknown service, no eligible instance, a rule it cannot lease).
		s.refused = err
		s.refusedUntil = time.Now().Add(errorRetry)
	default:
		if !s.offline {
			s.offline = true
			// Tickets held from before the outage are dropped: a restarted rota counts from 0 again.
			s.cur, s.next = nil, nil
			if l.goOffline() {
				l.log.Warn("rota: unreachable; routing over the last known instances with a local rotation", "service", l.service, "error", err)
			}
		}
		retry = l.opts.backoff.Delay(s.attempt)
		s.attempt++
		wake = true
	}
	s.mu.Unlock()
	if retry > 0 {
		time.AfterFunc(retry, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.fetching && s.offline && !s.owner.isClosed() {
				s.startFetch()
			}
		})
	}
	if wake {
		s.owner.wake()
	}
}

// localError marks a lease answer the channel cannot use (a rule it cannot map).
type localError struct{ error }

func isLocalError(err error) bool {
	var le localError
	return errors.As(err, &le)
}

// blockOf is the block of a lease answer over its view: a ticket range, or rota's picks.
func blockOf(resp *rotapb.LeaseResponse, view *leaseView) (*block, error) {
	picks := resp.GetPicks()
	if len(picks) == 0 {
		return &block{first: resp.GetFirstTicket(), count: resp.GetCount(), view: view}, nil
	}
	b := &block{count: uint32(len(picks)), view: view, picks: make([]int, len(picks)), tickets: make([]uint64, len(picks))}
	for i, p := range picks {
		if int(p.GetPosition()) >= len(view.ids) {
			return nil, localError{status.Errorf(codes.Unavailable, "rota: lease pick %d names instance %d of %d", i, p.GetPosition(), len(view.ids))}
		}
		b.picks[i], b.tickets[i] = int(p.GetPosition()), p.GetTicket()
	}
	return b, nil
}

func viewOf(resp *rotapb.LeaseResponse) (*leaseView, error) {
	rule, err := parseLeasedRule(resp.GetRule())
	if err != nil {
		return nil, localError{status.Error(codes.InvalidArgument, err.Error())}
	}
	instances := resp.GetInstances()
	v := &leaseView{rule: resp.GetRule(), ids: make([]string, len(instances)), addrs: make([]string, len(instances)), weights: make([]uint64, len(instances))}
	for i, inst := range instances {
		v.ids[i] = inst.GetId()
		v.addrs[i] = instanceAddr(inst)
		v.weights[i] = weightOf(inst)
	}
	v.m = newTicketMap(rule, v.weights)
	return v, nil
}
