// Package channel puts rota inside standard gRPC channels: importing it registers the `rota`
// resolver scheme and the `rota` load-balancing policy with grpc-go, so that
//
//	conn, err := grpc.NewClient("rota:///orders", grpc.WithTransportCredentials(insecure.NewCredentials()))
//
// routes every RPC of conn by rota's rotation for the service "orders".
//
// The resolver follows the service with rota's Watch and hands the UP instances to the channel,
// which keeps one subchannel per instance. The policy leases blocks of consecutive tickets of
// the shared rotation (Balancer.Lease); rota answers each block with the position in its list
// of every ticket's instance, and the channel routes each RPC by indexing: the rotation stays
// exact across every consumer, whatever rule rota leases, and an RPC costs a local pick. The
// next block is leased in the background before the current one runs out; its size adapts to
// the RPC rate (one lease per about 75 ms, between MinLease and MaxLease tickets). An answer
// whose positions do not fit (not one per ticket, or beyond the list) fails the calls with
// UNAVAILABLE naming the problem, and is asked again after 500 ms.
//
// A rule given to the channel (WithRule, or the policy config's "rule") must be one rota
// leases: round_robin, repeat(n=N) or weighted; the channel itself reads no rule. A call's
// version comes from its `x-rota-version` metadata (or rota.WithVersion on its
// context), with the same isolation and fallback as Pick; one lease stream is kept per version
// in use (at most MaxVersions). An instance is unusable while its subchannel is not READY, and
// for 10 s after 3 calls in a row to it ended DEADLINE_EXCEEDED (a hung instance keeps its
// connections open; each further 3 timeouts in a row double the hold, up to 60 s; any answer
// ends the count). A ticket whose instance is unusable is passed over, a gap in the shared
// rotation, and the call takes the next ticket whose instance is usable: the usable instances
// keep the rule's shares among themselves (repeat's runs stay whole). Every Lease excludes the
// instances unusable when it is sent (LeaseRequest.exclude), so the next block maps over the
// usable ones only. A lease without a version of a service under gray release is answered with
// rota's own picks instead of a ticket range (LeaseResponse.picks: per call an instance, of
// whichever version the split chose, and its ticket); the channel uses them in order, passing
// over a pick whose instance is unusable in the same way. rota's refusals fail calls with
// UNAVAILABLE and rota's message, since grpc-go turns a picker's INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, ... into INTERNAL. Outcomes (status and latency of every call) are
// reported to rota in batches. When rota cannot be reached, the channel goes on with a local
// rotation, logs it once, and returns to leases when rota answers again: one call each, in id
// order, over the usable instances of the last leased list (or of its own list when no lease
// was seen), without the rule's weights or runs; after a lease answered with picks, those picks
// over again in order, keeping rota's last split.
//
// rota's address is the target's (rota://HOST:PORT/SERVICE), else WithServer's, else
// $ROTA_SERVER, else 127.0.0.1:50051.
//
// RegisterXDSPolicy registers the same policy under XDSPolicyName (rota.v1.CentralRotation),
// the custom policy (gRFC A52) rota's xDS clusters name first: an xds:///SERVICE channel of
// grpc-go's xDS client then leases tickets of the cluster's service, version and rule from the
// rota it names, and routes each call to the endpoint whose address is its instance's.
package channel
