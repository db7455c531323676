package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import org.junit.jupiter.api.Test;

import io.rota.v1.PickRequest;

class LocalBalancerTest {
    private static final String REASON = "rota unreachable";

    private static Instance instance(String id, String version, InstanceStatus status) {
        return Instance.of("svc", "127.0.0.1", 9000).withId(id).withVersion(version).withStatus(status);
    }

    private static final List<Instance> INSTANCES = List.of(
            instance("a", "", InstanceStatus.UP),
            instance("b", "", InstanceStatus.UP),
            instance("c", "", InstanceStatus.DOWN),
            instance("d", "", InstanceStatus.DRAINING),
            instance("e", "", InstanceStatus.UP),
            instance("z1", "zlt", InstanceStatus.UP),
            instance("z2", "zlt", InstanceStatus.UP),
            instance("x", "bob", InstanceStatus.DOWN));

    private static List<String> ids(LocalBalancer balancer, PickRequest request, int count) {
        List<String> ids = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            ids.add(balancer.pick(request, INSTANCES, 9, REASON).orElseThrow().id());
        }
        return ids;
    }

    private static PickRequest request(String version) {
        return PickRequest.newBuilder().setService("svc").setVersion(version).build();
    }

    @Test
    void roundRobinOverUpInstancesWithNoVersion() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("a", "b", "e", "a", "b", "e", "a"), ids(balancer, request(""), 7));
    }

    @Test
    void aPickSaysItWasMadeLocally() {
        Pick pick = new LocalBalancer().pick(request(""), INSTANCES, 9, REASON).orElseThrow();
        assertTrue(pick.localFallback());
        assertEquals("a", pick.id());
        assertEquals(0, pick.ticket());
        assertEquals("round_robin", pick.rule());
        assertEquals(REASON, pick.fallback());
        assertEquals(9, pick.epoch());
    }

    @Test
    void versionPicksOnlyThatVersion() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("z1", "z2", "z1"), ids(balancer, request("zlt"), 3));
        Pick pick = balancer.pick(request("zlt"), INSTANCES, 9, REASON).orElseThrow();
        assertEquals(REASON, pick.fallback());
        assertEquals(3, pick.ticket());
    }

    @Test
    void unknownOrDownVersionFallsBackToInstancesWithNoVersion() {
        LocalBalancer balancer = new LocalBalancer();
        Pick pick = balancer.pick(request("bob"), INSTANCES, 9, REASON).orElseThrow();
        assertEquals("a", pick.id());
        assertEquals(REASON + "; no instance with version \"bob\"; picked from instances with no version", pick.fallback());
        // The no-version subset has one counter, whichever way a pick got there.
        assertEquals("b", balancer.pick(request(""), INSTANCES, 9, REASON).orElseThrow().id());
        assertEquals("e", balancer.pick(request("nobody"), INSTANCES, 9, REASON).orElseThrow().id());
    }

    @Test
    void subsetsRotateIndependently() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("a", "b"), ids(balancer, request(""), 2));
        assertEquals(List.of("z1"), ids(balancer, request("zlt"), 1));
        assertEquals(List.of("e"), ids(balancer, request(""), 1));
        PickRequest other = PickRequest.newBuilder().setService("other").build();
        assertEquals("a", balancer.pick(other, INSTANCES, 1, REASON).orElseThrow().id());
    }

    @Test
    void excludedIdsAreSkipped() {
        LocalBalancer balancer = new LocalBalancer();
        PickRequest request = request("").toBuilder().addExclude("a").addExclude("e").build();
        assertEquals("b", balancer.pick(request, INSTANCES, 9, REASON).orElseThrow().id());
        assertEquals("b", balancer.pick(request, INSTANCES, 9, REASON).orElseThrow().id());
    }

    @Test
    void nothingEligibleGivesNothing() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(Optional.empty(), balancer.pick(request(""), List.of(), 0, REASON));
        List<Instance> down = List.of(instance("c", "", InstanceStatus.DOWN), instance("z", "zlt", InstanceStatus.UP));
        assertEquals(Optional.empty(), balancer.pick(request(""), down, 0, REASON));
        assertEquals("z", balancer.pick(request("zlt"), down, 0, REASON).orElseThrow().id());
    }
}
