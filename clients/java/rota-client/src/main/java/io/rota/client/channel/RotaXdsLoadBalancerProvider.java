package io.rota.client.channel;

import java.util.Map;

import io.grpc.LoadBalancer;
import io.grpc.LoadBalancerProvider;
import io.grpc.NameResolver.ConfigOrError;
import io.grpc.Status;

/**
 * rota's own load-balancing policy as an xDS custom policy (gRFC A52), under the name
 * {@value RotaChannels#XDS_POLICY}: rota's clusters name it first (a {@code TypedStruct} of type
 * {@code type.googleapis.com/rota.v1.CentralRotation} under {@code wrr_locality}), with the JSON
 * config {@code {"service": "echo", "version": "", "rule": "round_robin"}}. A client that has it
 * registered ({@link RotaChannels#registerXdsPolicy}) routes the cluster's RPCs by leased tickets
 * of rota's central rotation over the endpoints xDS gives it; others take the next policy. It is
 * not in {@code META-INF/services}: it needs rota's address, which only the application knows.
 */
final class RotaXdsLoadBalancerProvider extends LoadBalancerProvider {
    private final RotaLoadBalancer.XdsSettings settings;

    RotaXdsLoadBalancerProvider(RotaLoadBalancer.XdsSettings settings) {
        this.settings = settings;
    }

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
        return RotaChannels.XDS_POLICY;
    }

    @Override
    public LoadBalancer newLoadBalancer(LoadBalancer.Helper helper) {
        return new RotaLoadBalancer(helper, settings);
    }

    /**
     * Lenient, since a config refused here makes the client NACK the whole Cluster: fields it does
     * not know are ignored. {@code service} must be a non-empty string; {@code version} and
     * {@code rule}, when present, strings (an empty rule: the service's; any other is rota's to
     * accept when it leases).
     */
    @Override
    public ConfigOrError parseLoadBalancingPolicyConfig(Map<String, ?> raw) {
        if (raw == null) {
            return refuse("no config");
        }
        Object service = raw.get("service");
        if (!(service instanceof String s) || s.isBlank()) {
            return refuse("service must be a non-empty string; got " + raw);
        }
        Object version = raw.containsKey("version") ? raw.get("version") : "";
        Object rule = raw.containsKey("rule") ? raw.get("rule") : "";
        if (!(version instanceof String v) || !(rule instanceof String r)) {
            return refuse("version and rule must be strings; got " + raw);
        }
        return ConfigOrError.fromConfig(new XdsConfig(s.trim(), v.trim(), r.trim()));
    }

    private static ConfigOrError refuse(String why) {
        return ConfigOrError.fromError(Status.INVALID_ARGUMENT.withDescription(RotaChannels.XDS_POLICY + " config: " + why));
    }

    /** One cluster's config: what its lease names. */
    record XdsConfig(String service, String version, String rule) {
    }
}
