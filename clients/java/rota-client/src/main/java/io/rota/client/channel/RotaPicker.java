package io.rota.client.channel;

import java.util.Map;

import io.grpc.ClientStreamTracer;
import io.grpc.ConnectivityState;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.LoadBalancer.PickResult;
import io.grpc.LoadBalancer.PickSubchannelArgs;
import io.grpc.LoadBalancer.Subchannel;
import io.grpc.LoadBalancer.SubchannelPicker;
import io.rota.v1.CallResult;

/**
 * Picks per RPC: the version from the call's {@value RotaChannels#VERSION_HEADER} header (else
 * the policy's), that version's rotation, its next ticket among the READY instances; the
 * outcome (latency, status) goes to rota's {@code Report} in batches.
 */
final class RotaPicker extends SubchannelPicker {
    private final RotaLoadBalancer balancer;
    private final Map<String, Subchannel> ready;
    private final ConnectivityState state;
    private final Status failure;
    private final RotaLoadBalancerProvider.PolicyConfig config;

    RotaPicker(RotaLoadBalancer balancer, Map<String, Subchannel> ready, ConnectivityState state, Status failure,
            RotaLoadBalancerProvider.PolicyConfig config) {
        this.balancer = balancer;
        this.ready = ready;
        this.state = state;
        this.failure = failure;
        this.config = config;
    }

    @Override
    public PickResult pickSubchannel(PickSubchannelArgs args) {
        if (ready.isEmpty()) {
            return state == ConnectivityState.TRANSIENT_FAILURE ? PickResult.withError(failure) : PickResult.withNoResult();
        }
        Metadata headers = args.getHeaders();
        String version = headers.get(RotaChannels.VERSION_KEY);
        if (version == null) {
            version = config.version();
        }
        Rotation.Decision decision = balancer.rotation(version.trim()).draw(ready::containsKey);
        Rotation.Draw draw = decision.draw();
        if (draw == null) {
            if (decision.failure() == null || decision.failure().isOk()) {
                return PickResult.withNoResult();
            }
            return PickResult.withError(decision.failure());
        }
        Subchannel subchannel = ready.get(draw.member().id());
        if (config.ticketHeader()) {
            headers.discardAll(RotaChannels.TICKET_KEY);
            headers.put(RotaChannels.TICKET_KEY, (draw.local() ? "L" : "") + Long.toUnsignedString(draw.ticket()));
        }
        return PickResult.withSubchannel(subchannel, new OutcomeTracers(balancer.link(), draw));
    }

    /** Times each stream of a picked RPC and reports its outcome. */
    private static final class OutcomeTracers extends ClientStreamTracer.Factory {
        private final RotaLink link;
        private final Rotation.Draw draw;

        OutcomeTracers(RotaLink link, Rotation.Draw draw) {
            this.link = link;
            this.draw = draw;
        }

        @Override
        public ClientStreamTracer newClientStreamTracer(ClientStreamTracer.StreamInfo info, Metadata headers) {
            long started = System.nanoTime();
            return new ClientStreamTracer() {
                private volatile boolean answered;

                @Override
                public void inboundHeaders() {
                    answered = true;
                }

                @Override
                public void streamClosed(Status status) {
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
