package channel

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// holdTimeouts is how many calls in a row to one instance must end DEADLINE_EXCEEDED
	// before the channel holds the instance out.
	holdTimeouts = 3
	// firstHold is the first hold of an instance; each further holdTimeouts timeouts in a row
	// double it, up to maxHold.
	firstHold = 10 * time.Second
	maxHold   = 60 * time.Second
)

// holdout tracks the timeouts of one instance's calls and holds the instance out of the
// channel's picks after holdTimeouts of them in a row: a hung instance (a stopped process
// whose connections stay open) keeps its subchannel READY, and would otherwise take every
// call its tickets map to until each times out.
type holdout struct {
	// until is the end of the current hold in Unix nanoseconds, 0 when the instance is not
	// held; the picker reads it without a lock.
	until atomic.Int64
	// epoch counts the holds. A call picked before the current hold began says nothing new
	// when it times out, so its timeout does not count towards the next hold.
	epoch atomic.Uint64

	mu sync.Mutex
	// streak is the number of calls in a row that ended DEADLINE_EXCEEDED since the last
	// answer or the last hold.
	streak int
	// next is the length of the next hold.
	next time.Duration
}

// held reports whether the instance is held out at now(); now is called only while a hold
// is set. A nil holdout is never held.
func (h *holdout) held(now func() time.Time) bool {
	if h == nil {
		return false
	}
	until := h.until.Load()
	if until == 0 {
		return false
	}
	if now().UnixNano() < until {
		return true
	}
	// The hold is over: the next call whose ticket maps here tries the instance again.
	h.until.CompareAndSwap(until, 0)
	return false
}

// callEpoch is the epoch a call picked now carries to record.
func (h *holdout) callEpoch() uint64 {
	if h == nil {
		return 0
	}
	return h.epoch.Load()
}

// record counts a finished call picked at epoch: DEADLINE_EXCEEDED after the call was sent
// is a timeout; any answer from the instance (success, or a status other than a connect
// failure) ends the streak and brings the next hold back to firstHold; calls the caller
// cancelled, and connect failures, change nothing.
func (h *holdout) record(done balancer.DoneInfo, epoch uint64, now time.Time) {
	if h == nil {
		return
	}
	switch code := status.Code(done.Err); {
	case done.Err == nil:
		h.answered()
	case code == codes.Canceled:
	case code == codes.DeadlineExceeded:
		if done.BytesSent {
			h.timedOut(epoch, now)
		}
	case code == codes.Unavailable && !done.BytesReceived:
		// A connect failure: the subchannel's state says so already.
	default:
		h.answered()
	}
}

func (h *holdout) answered() {
	h.mu.Lock()
	h.streak = 0
	h.next = 0
	h.mu.Unlock()
}

func (h *holdout) timedOut(epoch uint64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if epoch != h.epoch.Load() {
		return
	}
	h.streak++
	if h.streak < holdTimeouts {
		return
	}
	hold := h.next
	if hold == 0 {
		hold = firstHold
	}
	h.next = min(2*hold, maxHold)
	h.streak = 0
	h.epoch.Add(1)
	h.until.Store(now.Add(hold).UnixNano())
}
