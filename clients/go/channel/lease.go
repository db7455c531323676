package channel

import (
	"context"
	"errors"
	"sort"
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

// leaseView is one lease's instance list, ordered by id.
type leaseView struct {
	rule  string
	ids   []string
	addrs []string
	// keys and addrKeys are the subchannel keys of each position: by id and address, or
	// (xDS) by address alone.
	keys     []string
	addrKeys []string
}

func newLeaseView(rule string, ids, addrs []string) *leaseView {
	v := &leaseView{rule: rule, ids: ids, addrs: addrs, keys: make([]string, len(ids)), addrKeys: make([]string, len(ids))}
	for i := range ids {
		v.keys[i] = subConnKey(ids[i], addrs[i])
		v.addrKeys[i] = subConnKey("", addrs[i])
	}
	return v
}

func (v *leaseView) same(o *leaseView) bool {
	if v == nil || o == nil || v.rule != o.rule || len(v.ids) != len(o.ids) {
		return false
	}
	for i := range v.ids {
		if v.ids[i] != o.ids[i] || v.addrs[i] != o.addrs[i] {
			return false
		}
	}
	return true
}

// block is one lease, of which used draws are spent: either a run of tickets first ..
// first+count-1, ticket first+i going to view position positions[i] as rota mapped it, or
// (tickets set) rota's own picks, the i-th going to view position positions[i] with
// tickets[i]: a lease without a version of a service under gray release, whose version rota
// chooses per pick.
type block struct {
	first     uint64
	count     uint32
	used      uint32
	view      *leaseView
	positions []int
	tickets   []uint64
}

func (b *block) picks() bool { return b.tickets != nil }

// usability tells the stream which view positions a call may go to: READY and not held out.
type usability interface {
	usable(view *leaseView, pos int) (readyConn, bool)
}

// draw is one ticket for one RPC, with the usable instance it goes to.
type draw struct {
	ticket uint64
	view   *leaseView
	pos    int
	conn   readyConn
	local  bool // from the local rotation (rota unreachable)
	// picked: rota chose the instance by a pick of a picks block (or its replay by the local
	// rotation) rather than a ticket range.
	picked bool
}

// takeState is what take found for an RPC.
type takeState int

const (
	// drawn: the draw is the RPC's.
	drawn takeState = iota
	// waitLease: the RPC waits for a lease; the picker is republished when it lands.
	waitLease
	// noneUsable: no instance of the block's list is usable.
	noneUsable
)

// leaser holds the lease streams of one channel, one per version in use.
type leaser struct {
	link *link
	rule string
	// wake republishes the picker, so that RPCs queued for a lease are picked again.
	wake func()
	// local returns the view to rotate over when rota is unreachable and no lease was seen.
	local func(version string) *leaseView

	closed atomic.Bool
	// current is the picker last published, whose subchannel states and holds say which
	// instances each Lease excludes.
	current atomic.Pointer[picker]

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
	// excluded are the instances the last lease excluded (see leaser.exclude).
	excluded excludedKeys
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
	s.excluded = nil
	s.mu.Unlock()
}

// take returns the next ticket whose instance u holds usable, and that instance. A ticket
// whose instance is unusable is consumed and never sent (a gap in the shared rotation, like a
// ticket another consumer drew), and the next one is taken: the next tickets follow rota's own
// sequence, so the usable instances keep the rule's shares among themselves. The skipping is
// bounded: when the current and the next block hold no usable ticket, the RPC waits for the
// next lease (which excludes the unusable instances). state is noneUsable when no instance of
// the block's list is usable (nothing is consumed then); err is set when rota refused the
// lease.
func (s *versionStream) take(u usability) (d draw, state takeState, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.used = now
	if s.offline {
		return s.takeLocal(u)
	}
	var checked *leaseView // the view anyUsable was last asked about
	for {
		if b := s.cur; b != nil && b.used < b.count {
			for ; b.used < b.count; b.used++ {
				pos := b.positions[b.used]
				c, ok := u.usable(b.view, pos)
				if !ok {
					if checked != b.view {
						checked = b.view
						if !anyUsable(u, b.view) {
							return draw{}, noneUsable, nil
						}
					}
					continue
				}
				d := draw{ticket: b.first + uint64(b.used), view: b.view, pos: pos, conn: c, picked: b.picks()}
				if d.picked {
					d.ticket = b.tickets[b.used]
				}
				b.used++
				// Keep one block ahead: the next lease has the whole of this block's life (about
				// leaseTarget) to arrive, so calls do not wait for it even when rota is slow.
				if s.next == nil && !s.fetching {
					s.startFetch()
				}
				return d, drawn, nil
			}
		}
		if s.next != nil {
			s.activate(s.next, now)
			s.next = nil
			continue
		}
		if s.refused != nil && now.Before(s.refusedUntil) {
			return draw{}, waitLease, s.refused
		}
		if !s.fetching {
			s.startFetch()
		}
		s.waiting = true
		return draw{}, waitLease, nil
	}
}

// takeLocal is take while rota is unreachable: a plain rotation, one call each in id order,
// over the usable instances of the last leased list (or of the channel's list when no lease
// was seen), by a local counter; after a lease answered with picks, those picks over again in
// order (keeping rota's last split), passing over those whose instance is unusable. Called
// with s.mu held.
func (s *versionStream) takeLocal(u usability) (draw, takeState, error) {
	view := s.last
	if view == nil {
		view = s.owner.local(s.version)
	}
	if view == nil {
		return draw{}, waitLease, status.Errorf(codes.Unavailable, "rota is unreachable and no instance of %q is known", s.owner.link.service)
	}
	picks := view == s.last && len(s.lastPicks) > 0
	turns := uint64(len(view.ids))
	if picks {
		turns = uint64(len(s.lastPicks))
	}
	for turn := uint64(0); turn < turns; turn++ {
		ticket := s.localTicket + turn
		pos := int(ticket % turns)
		if picks {
			pos = s.lastPicks[pos]
		}
		if c, ok := u.usable(view, pos); ok {
			s.localTicket = ticket + 1
			return draw{ticket: ticket, view: view, pos: pos, conn: c, local: true, picked: picks}, drawn, nil
		}
	}
	return draw{}, noneUsable, nil
}

// anyUsable reports whether some instance of view is usable.
func anyUsable(u usability, view *leaseView) bool {
	for i := range view.ids {
		if _, ok := u.usable(view, i); ok {
			return true
		}
	}
	return false
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

// startFetch leases s.k tickets in the background, excluding the instances unusable now.
// Called with s.mu held.
func (s *versionStream) startFetch() {
	s.fetching = true
	var exclude []string
	exclude, s.excluded = s.owner.exclude(s.last, s.excluded)
	go s.fetch(s.k, s.gen, exclude)
}

func (s *versionStream) fetch(count uint32, gen uint64, exclude []string) {
	l := s.owner.link
	ctx, cancel := context.WithTimeout(context.Background(), leaseTimeout)
	var trailer metadata.MD
	resp, err := l.balancer.Lease(ctx, &rotapb.LeaseRequest{
		Service: l.service, Rule: s.owner.rule, Version: s.version, Count: count, Exclude: exclude,
	}, grpc.Trailer(&trailer))
	cancel()
	if err != nil && len(exclude) > 0 && trailer.Get("rota-error") != nil && status.Code(err) == codes.Unavailable {
		// rota refuses a lease that excludes every eligible instance (no ticket taken). Lease
		// over all of them: the calls then wait while an instance is connecting, else fail, as
		// with any list of which nothing is usable.
		s.fetch(count, gen, nil)
		return
	}
	var b *block
	if err == nil {
		b, err = blockOf(resp)
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
		if s.last.same(b.view) {
			b.view = s.last
		}
		s.last, s.lastPicks = b.view, nil
		if b.picks() {
			s.lastPicks = b.positions
		}
		if s.cur == nil || s.cur.used >= s.cur.count {
			s.activate(b, time.Now())
		} else {
			s.next = b
		}
	case trailer.Get("rota-error") != nil || isLocalError(err):
		// rota's own answer (unknown service, no eligible instance, a rule it cannot lease), or
		// an answer the channel cannot use.
		var le localError
		if errors.As(err, &le) {
			err = le.error
		}
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

// localError marks a lease answer the channel cannot use (positions that do not fit it).
type localError struct{ error }

func isLocalError(err error) bool {
	var le localError
	return errors.As(err, &le)
}

// blockOf is the block of a lease answer: a ticket range with the position of each ticket's
// instance, or rota's picks. An answer whose positions do not fit (not one per ticket, or
// naming an instance beyond the list) is refused.
func blockOf(resp *rotapb.LeaseResponse) (*block, error) {
	instances := resp.GetInstances()
	ids, addrs := make([]string, len(instances)), make([]string, len(instances))
	for i, inst := range instances {
		ids[i], addrs[i] = inst.GetId(), instanceAddr(inst)
	}
	view := newLeaseView(resp.GetRule(), ids, addrs)
	unusable := func(format string, args ...any) error {
		return localError{status.Errorf(codes.Unavailable, "rota: unusable lease answer: "+format, args...)}
	}
	picks := resp.GetPicks()
	if len(picks) > 0 {
		b := &block{count: uint32(len(picks)), view: view, positions: make([]int, len(picks)), tickets: make([]uint64, len(picks))}
		for i, p := range picks {
			if int(p.GetPosition()) >= len(ids) {
				return nil, unusable("pick %d names instance %d of %d", i, p.GetPosition(), len(ids))
			}
			b.positions[i], b.tickets[i] = int(p.GetPosition()), p.GetTicket()
		}
		return b, nil
	}
	positions := resp.GetPositions()
	if uint64(len(positions)) != uint64(resp.GetCount()) {
		return nil, unusable("%d positions for %d tickets", len(positions), resp.GetCount())
	}
	b := &block{first: resp.GetFirstTicket(), count: resp.GetCount(), view: view, positions: make([]int, len(positions))}
	for i, p := range positions {
		if int(p) >= len(ids) {
			return nil, unusable("ticket %d at position %d of %d instances", resp.GetFirstTicket()+uint64(i), p, len(ids))
		}
		b.positions[i] = int(p)
	}
	return b, nil
}

// maxExclude is the most ids one Lease may exclude (rota's bound).
const maxExclude = 1000

// excludedKeys are the subchannel keys (by id and address, by address alone) of the instances
// a lease excluded, by id.
type excludedKeys map[string][2]string

// exclude lists the ids of the instances the channel holds unusable now, of the list it knows
// (the resolver's instances; last, the last leased list; and those the previous lease excluded,
// which a list rota answered without them no longer names), in id order, at most maxExclude;
// and their keys, for the next call.
func (ls *leaser) exclude(last *leaseView, previous excludedKeys) ([]string, excludedKeys) {
	p := ls.current.Load()
	if p == nil {
		return nil, nil
	}
	set := excludedKeys{}
	check := func(id, key, addrKey string) {
		if _, ok := p.usableAt(key, addrKey); !ok && id != "" {
			set[id] = [2]string{key, addrKey}
		}
	}
	if p.byAddr {
		// Without the resolver's list (xDS gives addresses), the instances a lease excluded are
		// known only from here until the endpoints change (the stream's reset forgets them).
		for id, keys := range previous {
			check(id, keys[0], keys[1])
		}
	}
	if last != nil {
		for i, id := range last.ids {
			check(id, last.keys[i], last.addrKeys[i])
		}
	}
	if p.known != nil && !p.byAddr {
		for _, k := range p.known.instances {
			check(k.info.id, subConnKey(k.info.id, k.addr), subConnKey("", k.addr))
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if len(ids) > maxExclude {
		for _, id := range ids[maxExclude:] {
			delete(set, id)
		}
		ids = ids[:maxExclude]
	}
	return ids, set
}
