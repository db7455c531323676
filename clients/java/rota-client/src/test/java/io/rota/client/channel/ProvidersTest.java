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
    void policyConfigTakesLeasableRulesOnly() {
        RotaLoadBalancerProvider provider = new RotaLoadBalancerProvider();
        ConfigOrError ok = provider.parseLoadBalancingPolicyConfig(Map.of("rule", "repeat(n=3)", "version", "zlt"));
        assertEquals(new RotaLoadBalancerProvider.PolicyConfig("repeat(n=3)", "zlt", false), ok.getConfig());
        ConfigOrError bad = provider.parseLoadBalancingPolicyConfig(Map.of("rule", "random"));
        assertTrue(bad.getError() != null && bad.getError().getDescription().contains("cannot be leased"), String.valueOf(bad));
        assertTrue(provider.parseLoadBalancingPolicyConfig(Map.of("rule", 3.0)).getError() != null);
    }
}
