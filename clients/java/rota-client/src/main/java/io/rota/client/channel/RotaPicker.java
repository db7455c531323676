package io.rota.client.channel;

import java.util.Map;
import java.util.function.Predicate;

import io.grpc.ClientStreamTracer;
import io.grpc.ConnectivityState;
import io.grpc.Deadline;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.LoadBalancer.PickResult;
import io.grpc.LoadBalancer.PickSubchannelArgs;
import io.grpc.LoadBalancer.Subchannel;
import io.grpc.LoadBalancer.SubchannelPicker;
import io.rota.v1.CallResult;

/**
 * Picks per RPC: the version from the call's {@value RotaChannels#VERSION_HEADER} header (else
 * the policy's), that version's rotation and its next ticket whose instance is usable (READY and
 * not held out for timeouts); the outcome (latency, status) goes to
 * rota's {@code Report} in batches, and to the instance's {@link HoldOut}.
 */
final class RotaPicker extends SubchannelPicker {
    /** A READY instance: its subchannel and its timeout count. */
    record Ready(Subchannel subchannel, HoldOut hold) {
    }

    private final RotaLoadBalancer balancer;
    private final Map<String, Ready> ready;
    private final ConnectivityState state;
    private final boolean connecting;
    private final Status failure;
    private final RotaLoadBalancerProvider.PolicyConfig config;
    private final Predicate<Member> usable;

    /**
     * @param connecting whether some subchannel is connecting: an RPC none of whose instances is
     *     usable waits for it rather than failing
     */
    RotaPicker(RotaLoadBalancer balancer, Map<String, Ready> ready, ConnectivityState state, boolean connecting,
            Status failure, RotaLoadBalancerProvider.PolicyConfig config) {
        this.balancer = balancer;
        this.ready = ready;
        this.state = state;
        this.connecting = connecting;
        this.failure = failure;
        this.config = config;
        this.usable = member -> {
            Ready r = ready.get(balancer.key(member));
            return r != null && !r.hold().heldOut();
        };
    }

    @Override
    public PickResult pickSubchannel(PickSubchannelArgs args) {
        if (ready.isEmpty()) {
            return state == ConnectivityState.TRANSIENT_FAILURE ? PickResult.withError(failure) : PickResult.withNoResult();
        }
        Metadata headers = args.getHeaders();
        String version = balancer.versionFromHeader() ? headers.get(RotaChannels.VERSION_KEY) : null;
        if (version == null) {
            version = config.version();
        }
        Rotation.Decision decision = balancer.rotation(version.trim()).draw(usable);
        Rotation.Draw draw = decision.draw();
        if (draw == null) {
            if (decision.failure() == null) {
                return PickResult.withNoResult();
            }
            if (decision.failure().isOk()) {
                // No listed instance is usable: as when none is READY, wait while one connects.
                return connecting ? PickResult.withNoResult() : PickResult.withError(Status.UNAVAILABLE.withDescription(
                        "no usable instance of " + balancer.link().service + " (not connected, or held out after "
                        + HoldOut.TIMEOUTS + " timeouts in a row); " + failure.getDescription()));
            }
            return PickResult.withError(decision.failure());
        }
        Ready target = ready.get(balancer.key(draw.member()));
        if (config.ticketHeader()) {
            headers.discardAll(RotaChannels.TICKET_KEY);
            headers.put(RotaChannels.TICKET_KEY, (draw.local() ? "L" : "") + Long.toUnsignedString(draw.ticket()));
        }
        return PickResult.withSubchannel(target.subchannel(), new OutcomeTracers(balancer.link(), draw, target.hold()));
    }

    /** Times each stream of a picked RPC, reports its outcome and counts its timeouts. */
    private static final class OutcomeTracers extends ClientStreamTracer.Factory {
        private final RotaLink link;
        private final Rotation.Draw draw;
        private final HoldOut hold;

        OutcomeTracers(RotaLink link, Rotation.Draw draw, HoldOut hold) {
            this.link = link;
            this.draw = draw;
            this.hold = hold;
        }

        @Override
        public ClientStreamTracer newClientStreamTracer(ClientStreamTracer.StreamInfo info, Metadata headers) {
            long started = System.nanoTime();
            Deadline deadline = info.getCallOptions().getDeadline();
            return new ClientStreamTracer() {
                /** Response headers came. */
                private volatile boolean answered;
                /** Headers or trailers came: the instance sent something. */
                private volatile boolean heard;

                @Override
                public void inboundHeaders() {
                    answered = true;
                    heard = true;
                }

                @Override
                public void inboundTrailers(Metadata trailers) {
                    heard = true;
                }

                @Override
                public void streamClosed(Status status) {
                    Status.Code code = status.getCode();
                    if (heard || code == Status.Code.OK) {
                        hold.answered();
                    } else if (code == Status.Code.DEADLINE_EXCEEDED
                            || (code == Status.Code.CANCELLED && deadline != null && deadline.isExpired())) {
                        // Under the channel's retry policy an attempt the deadline ends closes
                        // CANCELLED ("thrown away" by the call): its deadline has passed.
                        hold.timedOut();
                    }
                    // Else the caller cancelled, or nothing came from the instance (a connect
                    // failure, a connection lost): neither a timeout nor an answer.
                    CallResult result = status.isOk() ? CallResult.CALL_RESULT_OK
                            : !answered && status.getCode() == Status.Code.UNAVAILABLE ? CallResult.CALL_RESULT_CONNECT_FAILURE
                            : CallResult.CALL_RESULT_ERROR;
                    link.report(new RotaLink.Outcome(draw.member().id(), draw.local() ? 0 : draw.ticket(), draw.rule(),
                            (System.nanoTime() - started) / 1000, result));
                }
            };
        }
    }
}
