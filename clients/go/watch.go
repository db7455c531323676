package rota

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// WatchEventKind says what a WatchEvent reports.
type WatchEventKind int

const (
	// WatchSnapshot carries the service's full instance list; it is always the first event.
	WatchSnapshot WatchEventKind = iota + 1
	// WatchAdded reports an instance that was registered.
	WatchAdded
	// WatchUpdated reports an instance whose fields (status, weight, metadata, ...) changed.
	WatchUpdated
	// WatchRemoved reports an instance that was withdrawn or whose registration ended.
	WatchRemoved
)

// String returns "snapshot", "added", "updated" or "removed".
func (k WatchEventKind) String() string {
	switch k {
	case WatchSnapshot:
		return "snapshot"
	case WatchAdded:
		return "added"
	case WatchUpdated:
		return "updated"
	case WatchRemoved:
		return "removed"
	}
	return "unknown"
}

// WatchEvent is one event of a Watch.
type WatchEvent struct {
	Kind WatchEventKind
	// Epoch is the generation of the service's instance list after this event.
	Epoch uint64
	// Instances is the full list, ordered by id (WatchSnapshot only; every status).
	Instances []Instance
	// Instance is the instance as it is now (WatchAdded, WatchUpdated).
	Instance Instance
	// Ref names the instance the event is about (WatchAdded, WatchUpdated, WatchRemoved).
	Ref InstanceRef
}

// Watcher is an open Watch of one service. Read its events with Recv.
type Watcher struct {
	c      *Client
	stream rotapb.Registry_WatchClient
	ctx    context.Context
	cancel func()
	closed atomic.Bool
}

// Watch opens a watch of service: a snapshot of its instances (WatchSnapshot, also for a
// service rota does not know, as an empty list), then one event per change, read with
// Recv. The watch is one stream: it lasts until ctx is cancelled, Close is called, the client
// is closed or the stream breaks, and it does not reconnect (Follow keeps a reconnecting
// copy of a service for Pick's local fallback).
func (c *Client) Watch(ctx context.Context, service string) (*Watcher, error) {
	if c.closed() {
		return nil, errClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, contextError(ctx, "watching "+service)
	}
	wctx, cancel := context.WithCancel(ctx)
	// The client's Close ends the watch too.
	stop := context.AfterFunc(c.ctx, cancel)
	stream, err := c.registry.Watch(wctx, &rotapb.WatchRequest{Service: service})
	if err != nil {
		stop()
		cancel()
		w := &Watcher{c: c, ctx: ctx}
		return nil, w.error(err)
	}
	return &Watcher{c: c, stream: stream, ctx: ctx, cancel: func() { stop(); cancel() }}, nil
}

// Recv waits for the next event. It returns io.EOF when rota ended the stream, and once the
// watch has ended (ctx cancelled or past its deadline, Close, the client closed) an *Error
// that matches errors.Is(err, context.Canceled) or context.DeadlineExceeded for the
// context's end, codes.Canceled for Close. Other failures are *Error with the call's status.
func (w *Watcher) Recv() (WatchEvent, error) {
	for {
		pb, err := w.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return WatchEvent{}, io.EOF
			}
			return WatchEvent{}, w.error(err)
		}
		if event, ok := watchEventFromProto(pb); ok {
			return event, nil
		}
		// An event kind this client does not know (a newer rota): skipped.
	}
}

// Close ends the watch; a Recv waiting returns at once. It is idempotent.
func (w *Watcher) Close() {
	w.closed.Store(true)
	w.cancel()
}

var errWatchClosed = &Error{Code: codes.Canceled, Message: "the watch is closed"}

// error types the end of the watch: the caller's context, Close, the client's Close, or the
// call's own status.
func (w *Watcher) error(err error) error {
	switch {
	case w.ctx.Err() != nil:
		return contextError(w.ctx, "watching")
	case w.closed.Load():
		return errWatchClosed
	case w.c.closed():
		return errClosed
	}
	return rpcError(err)
}

func watchEventFromProto(pb *rotapb.WatchEvent) (WatchEvent, bool) {
	event := WatchEvent{Epoch: pb.GetEpoch()}
	switch e := pb.GetEvent().(type) {
	case *rotapb.WatchEvent_Snapshot:
		event.Kind = WatchSnapshot
		event.Instances = make([]Instance, 0, len(e.Snapshot.GetInstances()))
		for _, i := range e.Snapshot.GetInstances() {
			event.Instances = append(event.Instances, instanceFromProto(i))
		}
		slices.SortFunc(event.Instances, func(a, b Instance) int { return strings.Compare(a.ID, b.ID) })
	case *rotapb.WatchEvent_Added:
		event.Kind, event.Instance = WatchAdded, instanceFromProto(e.Added)
		event.Ref = event.Instance.Ref()
	case *rotapb.WatchEvent_Updated:
		event.Kind, event.Instance = WatchUpdated, instanceFromProto(e.Updated)
		event.Ref = event.Instance.Ref()
	case *rotapb.WatchEvent_Removed:
		event.Kind = WatchRemoved
		event.Ref = InstanceRef{Service: e.Removed.GetService(), ID: e.Removed.GetId()}
	default:
		return WatchEvent{}, false
	}
	return event, true
}
