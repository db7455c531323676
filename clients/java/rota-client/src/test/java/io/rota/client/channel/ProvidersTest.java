package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;

import org.junit.jupiter.api.Test;

import io.grpc.LoadBalancerRegistry;
import io.grpc.NameResolver.ConfigOrError;
import io.grpc.NameResolverRegistry;

class ProvidersTest {
    @Test
    void serviceLoaderRegistersTheSchemeAndThePolicy() {
        assertInstanceOf(RotaLoadBalancerProvider.class, LoadBalancerRegistry.getDefaultRegistry().getProvider("rota"));
        assertInstanceOf(RotaNameResolverProvider.class, NameResolverRegistry.getDefaultRegistry().getProviderForScheme("rota"));
        // Targets without a scheme keep resolving through DNS, never through rota.
        assertEquals("dns", NameResolverRegistry.getDefaultRegistry().getDefaultScheme());
    }

    @Test
    void publicApiKeepsTheGeneratedTypesInside() throws Exception {
        assertEquals(java.util.List.of(), io.rota.client.testing.PublicApi.uses(RotaChannels.class, "io.rota.v1"));
    }

    @Test
    void policyConfigTakesAnyRuleStringForRotaToAccept() {
        RotaLoadBalancerProvider provider = new RotaLoadBalancerProvider();
        ConfigOrError ok = provider.parseLoadBalancingPolicyConfig(Map.of("rule", "repeat(n=3)", "version", "zlt"));
        assertEquals(new RotaLoadBalancerProvider.PolicyConfig("repeat(n=3)", "zlt", false), ok.getConfig());
        // The channel holds no copy of the rules: which ones can be leased is rota's answer to the lease.
        ConfigOrError other = provider.parseLoadBalancingPolicyConfig(Map.of("rule", "some_future_rule"));
        assertEquals(new RotaLoadBalancerProvider.PolicyConfig("some_future_rule", "", false), other.getConfig());
        assertTrue(provider.parseLoadBalancingPolicyConfig(Map.of("rule", 3.0)).getError() != null);
    }
}
