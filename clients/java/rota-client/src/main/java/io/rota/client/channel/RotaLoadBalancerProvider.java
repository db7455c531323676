package io.rota.client.channel;

import java.util.Map;

import io.grpc.LoadBalancer;
import io.grpc.LoadBalancerProvider;
import io.grpc.NameResolver.ConfigOrError;
import io.grpc.Status;

/**
 * The {@value RotaChannels#POLICY} load-balancing policy: per RPC, the next leased ticket of
 * rota's shared rotation, sent to the instance rota's lease names for it. Its config (JSON):
 * {@code {"rule": "repeat(n=3)", "version": "", "ticketHeader": false}}, every field optional;
 * the rule is rota's to accept (a rule it cannot lease fails the RPCs with its refusal).
 * Registered through {@code META-INF/services/io.grpc.LoadBalancerProvider}.
 */
public final class RotaLoadBalancerProvider extends LoadBalancerProvider {
    @Override
    public boolean isAvailable() {
        return true;
    }

    @Override
    public int getPriority() {
        return 5;
    }

    @Override
    public String getPolicyName() {
        return RotaChannels.POLICY;
    }

    @Override
    public LoadBalancer newLoadBalancer(LoadBalancer.Helper helper) {
        return new RotaLoadBalancer(helper);
    }

    @Override
    public ConfigOrError parseLoadBalancingPolicyConfig(Map<String, ?> raw) {
        Object rule = raw.containsKey("rule") ? raw.get("rule") : "";
        Object version = raw.containsKey("version") ? raw.get("version") : "";
        Object ticketHeader = raw.containsKey("ticketHeader") ? raw.get("ticketHeader") : Boolean.FALSE;
        if (!(rule instanceof String r) || !(version instanceof String v) || !(ticketHeader instanceof Boolean t)) {
            return ConfigOrError.fromError(Status.INVALID_ARGUMENT.withDescription(
                    "rota policy config: rule and version must be strings, ticketHeader a boolean; got " + raw));
        }
        return ConfigOrError.fromConfig(new PolicyConfig(r.trim(), v.trim(), t));
    }

    /** The parsed policy config. */
    record PolicyConfig(String rule, String version, boolean ticketHeader) {
    }
}
