package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;

import io.grpc.LoadBalancerProvider;
import io.grpc.LoadBalancerRegistry;
import io.grpc.NameResolver.ConfigOrError;

/** rota's xDS policy (gRFC A52): its config as rota's clusters carry it, and its registration. */
class XdsPolicyTest {
    private static final RotaXdsLoadBalancerProvider PROVIDER =
            new RotaXdsLoadBalancerProvider(new RotaLoadBalancer.XdsSettings("127.0.0.1:1", io.rota.client.RotaCredentials.none(), false));

    private static RotaXdsLoadBalancerProvider.XdsConfig parsed(Map<String, ?> raw) {
        ConfigOrError result = PROVIDER.parseLoadBalancingPolicyConfig(raw);
        assertNull(result.getError(), () -> raw + ": " + result.getError());
        return (RotaXdsLoadBalancerProvider.XdsConfig) result.getConfig();
    }

    private static void refused(Map<String, ?> raw, String why) {
        ConfigOrError result = PROVIDER.parseLoadBalancingPolicyConfig(raw);
        assertNotNull(result.getError(), () -> raw + " was taken: " + result.getConfig());
        assertTrue(result.getError().getDescription().contains(why), result.getError()::toString);
    }

    @Test
    void theConfigRotaSendsParses() {
        assertEquals(new RotaXdsLoadBalancerProvider.XdsConfig("echo", "", "round_robin"),
                parsed(Map.of("service", "echo", "version", "", "rule", "round_robin")));
        assertEquals(new RotaXdsLoadBalancerProvider.XdsConfig("echo", "v2", "repeat(n=3)"),
                parsed(Map.of("service", "echo", "version", "v2", "rule", "repeat(n=3)")));
        // Only the service is needed (then the lease takes the service's rule), and fields this
        // client does not know are ignored rather than NACKing the cluster.
        assertEquals(new RotaXdsLoadBalancerProvider.XdsConfig("echo", "", ""), parsed(Map.of("service", "echo")));
        assertEquals(new RotaXdsLoadBalancerProvider.XdsConfig("echo", "", "weighted"), parsed(Map.of("service", "echo",
                "rule", "weighted", "cluster", "echo", "zone", Map.of("a", 1.0), "shards", List.of(1.0, 2.0))));
    }

    @Test
    void aConfigWithoutAServiceIsRefused() {
        refused(Map.of("version", "", "rule", "round_robin"), "service must be a non-empty string");
        refused(Map.of("service", "", "rule", "round_robin"), "service must be a non-empty string");
        refused(Map.of("service", "  "), "service must be a non-empty string");
        refused(Map.of(), "service must be a non-empty string");
        Map<String, Object> nullService = new HashMap<>();
        nullService.put("service", null);
        refused(nullService, "service must be a non-empty string");
    }

    @Test
    void junkIsRefused() {
        refused(Map.of("service", 5.0), "service must be a non-empty string");
        refused(Map.of("service", List.of("echo")), "service must be a non-empty string");
        refused(Map.of("service", Map.of("name", "echo")), "service must be a non-empty string");
        refused(Map.of("service", "echo", "rule", 3.0), "must be strings");
        refused(Map.of("service", "echo", "version", true), "must be strings");
        refused(null, "no config");
        assertTrue(PROVIDER.parseLoadBalancingPolicyConfig(Map.of("service", "echo", "rule", 1.0)).getError()
                .getDescription().startsWith(RotaChannels.XDS_POLICY + " config: "));
        // Any rule string: which ones can be leased is rota's answer to the lease.
        assertEquals(new RotaXdsLoadBalancerProvider.XdsConfig("echo", "", "least_request"),
                parsed(Map.of("service", "echo", "rule", "least_request")));
    }

    @Test
    void registrationPutsThePolicyUnderTheTypeNameAndReplacesTheLastOne() {
        LoadBalancerRegistry registry = LoadBalancerRegistry.getDefaultRegistry();
        assertEquals("rota.v1.CentralRotation", RotaChannels.XDS_POLICY);
        try {
            assertNull(registry.getProvider(RotaChannels.XDS_POLICY), "not in META-INF/services: it needs rota's address");
            RotaChannels.registerXdsPolicy("127.0.0.1:1");
            LoadBalancerProvider first = registry.getProvider(RotaChannels.XDS_POLICY);
            assertInstanceOf(RotaXdsLoadBalancerProvider.class, first);
            RotaChannels.registerXdsPolicy("127.0.0.1:2", XdsPolicyOptions.defaults().withTicketHeader(true));
            LoadBalancerProvider second = registry.getProvider(RotaChannels.XDS_POLICY);
            assertInstanceOf(RotaXdsLoadBalancerProvider.class, second);
            assertNotSame(first, second);
            assertThrows(IllegalArgumentException.class, () -> RotaChannels.registerXdsPolicy(" "));
            assertTrue(XdsPolicyOptions.defaults().withTicketHeader(true).ticketHeader());
            assertTrue(!XdsPolicyOptions.defaults().ticketHeader());
        } finally {
            RotaChannels.deregisterXdsPolicy();
        }
        assertNull(registry.getProvider(RotaChannels.XDS_POLICY));
    }

    @Test
    void addressesMatchWhateverFormTheirHostTakes() {
        assertEquals("::1", Member.canonicalHost("0:0:0:0:0:0:0:1"));
        assertEquals("::1", Member.canonicalHost("[::1]"));
        assertEquals("127.0.0.1", Member.canonicalHost("127.0.0.1"));
        assertEquals("echo.internal", Member.canonicalHost("echo.internal"));
    }
}
