package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.Test;

import io.grpc.Status;
import io.rota.v1.PickRequest;

class LocalBalancerTest {
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
            ids.add(balancer.pick(request, INSTANCES, 9).id());
        }
        return ids;
    }

    private static PickRequest request(String version, String... exclude) {
        return PickRequest.newBuilder().setService("svc").setVersion(version).addAllExclude(List.of(exclude)).build();
    }

    @Test
    void roundRobinOverUpInstancesWithNoVersion() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("a", "b", "e", "a", "b", "e", "a"), ids(balancer, request(""), 7));
    }

    @Test
    void aPickSaysItWasMadeLocallyAndLeavesFallbackToVersionFallbacks() {
        LocalBalancer balancer = new LocalBalancer();
        Pick first = balancer.pick(request(""), INSTANCES, 9);
        assertTrue(first.localFallback());
        assertEquals("a", first.id());
        assertEquals("round_robin", first.rule());
        assertEquals("", first.fallback());
        assertFalse(first.isFallback());
        assertEquals(9, first.epoch());
        List<Long> tickets = new ArrayList<>(List.of(first.ticket()));
        for (int i = 0; i < 3; i++) {
            tickets.add(balancer.pick(request(""), INSTANCES, 9).ticket());
        }
        assertEquals(List.of(0L, 1L, 2L, 3L), tickets);
    }

    @Test
    void versionPicksOnlyThatVersion() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("z1", "z2", "z1"), ids(balancer, request("zlt"), 3));
        Pick pick = balancer.pick(request("zlt"), INSTANCES, 9);
        assertEquals("", pick.fallback());
        assertEquals(3, pick.ticket());
    }

    @Test
    void unknownOrDownVersionFallsBackToInstancesWithNoVersion() {
        LocalBalancer balancer = new LocalBalancer();
        Pick pick = balancer.pick(request("bob"), INSTANCES, 9);
        assertEquals("a", pick.id());
        assertEquals("no instance with version \"bob\"; picked from instances with no version", pick.fallback());
        // The no-version subset has one counter, whichever way a pick got there.
        assertEquals("b", balancer.pick(request(""), INSTANCES, 9).id());
        Pick third = balancer.pick(request("nobody"), INSTANCES, 9);
        assertEquals("e", third.id());
        assertEquals(2, third.ticket());
    }

    @Test
    void subsetsRotateIndependently() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("a", "b"), ids(balancer, request(""), 2));
        assertEquals(List.of("z1"), ids(balancer, request("zlt"), 1));
        assertEquals(List.of("e"), ids(balancer, request(""), 1));
        PickRequest other = PickRequest.newBuilder().setService("other").build();
        Pick pick = balancer.pick(other, INSTANCES, 1);
        assertEquals("a", pick.id());
        assertEquals(0, pick.ticket());
    }

    @Test
    void excludedIdsAreSkippedInsideTheSubset() {
        LocalBalancer balancer = new LocalBalancer();
        assertEquals(List.of("b", "b"), ids(balancer, request("", "a", "e"), 2));
        // Ticket 2 takes position 2 mod 2 of [a, e], the instances left: a.
        assertEquals("a", balancer.pick(request("", "b"), INSTANCES, 9).id());
        assertEquals(List.of("z2", "z2"), ids(balancer, request("zlt", "z1"), 2));
    }

    @Test
    void theRotationRunsOverTheInstancesNotExcluded() {
        LocalBalancer balancer = new LocalBalancer();
        // As rota's round robin: ticket t takes position t mod 2 of [a, e] (skipping forward
        // from position t mod 3 of [a, b, e] would give a, e, e).
        assertEquals(List.of("a", "e", "a", "e", "a", "e"), ids(balancer, request("", "b"), 6));
        // Tickets 6, 7, 8 over [a, b].
        assertEquals(List.of("a", "b", "a"), ids(balancer, request("", "e"), 3));
    }

    @Test
    void anExcludedVersionSubsetFailsRatherThanFallingThroughToUnversionedInstances() {
        LocalBalancer balancer = new LocalBalancer();
        RotaException e = assertThrows(RotaException.class, () -> balancer.pick(request("zlt", "z1", "z2"), INSTANCES, 9));
        assertEquals(Status.Code.UNAVAILABLE, e.getCode());
        assertEquals("no_eligible_instance", e.reason());
        assertFalse(e.isUnreachable());
        assertTrue(e.getDescription().contains("that is not excluded"), e.getDescription());
        // No ticket was drawn for the failed pick.
        assertEquals(0, balancer.pick(request("zlt"), INSTANCES, 9).ticket());
    }

    @Test
    void aVersionFallbackIsExcludedInsideTheUnversionedSubset() {
        LocalBalancer balancer = new LocalBalancer();
        Pick pick = balancer.pick(request("nobody", "a"), INSTANCES, 9);
        assertEquals("b", pick.id());
        assertTrue(pick.isFallback());
        RotaException e = assertThrows(RotaException.class,
                () -> balancer.pick(request("nobody", "a", "b", "e"), INSTANCES, 9));
        assertEquals("no_eligible_instance", e.reason());
    }

    @Test
    void nothingEligibleFails() {
        LocalBalancer balancer = new LocalBalancer();
        assertThrows(RotaException.class, () -> balancer.pick(request(""), List.of(), 0));
        List<Instance> down = List.of(instance("c", "", InstanceStatus.DOWN), instance("z", "zlt", InstanceStatus.UP));
        RotaException e = assertThrows(RotaException.class, () -> balancer.pick(request(""), down, 0));
        assertEquals(Status.Code.UNAVAILABLE, e.getCode());
        assertEquals("z", balancer.pick(request("zlt"), down, 0).id());
    }
}
