package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.IntStream;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.PickRequest;
import io.rota.v1.PickResponse;

class TicketMappingTest {
    private static String letters(TicketMapping mapping, long from, int count, boolean[] excluded) {
        StringBuilder out = new StringBuilder();
        for (long t = from; t < from + count; t++) {
            out.append((char) ('A' + mapping.map(t, excluded)));
        }
        return out.toString();
    }

    @Test
    void rotatingRulesFollowTheirFormulas() {
        assertEquals("ABCABCA", letters(TicketMapping.of("round_robin", new int[3]), 0, 7, null));
        assertEquals("AAABBBCCCAAA", letters(TicketMapping.of("repeat(n=3)", new int[3]), 0, 12, null));
        assertEquals("AAAAABBBBBAA", letters(TicketMapping.of("repeat(n=5)", new int[2]), 0, 12, null));
        assertEquals("AAABBBCCC", letters(TicketMapping.of("repeat", new int[3]), 0, 9, null), "repeat is repeat(n=3)");
        // Excluded positions: the rotation goes on over the others.
        assertEquals("ACDACD", letters(TicketMapping.of("round_robin", new int[4]), 0, 6, new boolean[] {false, true, false, false}));
        assertEquals(-1, TicketMapping.of("round_robin", new int[2]).map(5, new boolean[] {true, true}));
        // Tickets are unsigned: the top of the range keeps rotating.
        assertEquals(Long.remainderUnsigned(-1L, 3), TicketMapping.of("round_robin", new int[3]).map(-1L, null));
    }

    @Test
    void weightedScheduleInterleavesByEarliestDeadline() {
        assertArrayEquals(new int[] {0, 0, 0, 1, 2, 0, 0}, TicketMapping.build(new int[] {5, 1, 1}));
        assertArrayEquals(new int[] {0, 1, 0}, TicketMapping.build(new int[] {2, 1}));
        assertArrayEquals(new int[] {0, 1, 2}, TicketMapping.build(new int[] {100, 100, 100}));
        assertArrayEquals(new int[] {0, 0, 2, 0}, TicketMapping.build(new int[] {3, 0, 1}));
        assertArrayEquals(new int[] {}, TicketMapping.build(new int[] {0, 0}));
        int[] huge = TicketMapping.build(new int[] {3_000_000, 1_000_001});
        assertTrue(huge.length <= TicketMapping.MAX_CYCLE);
    }

    @Test
    void onlyLeasableRulesAreAccepted() {
        assertTrue(TicketMapping.leasable("weighted"));
        assertTrue(TicketMapping.leasable("repeat(n=7)"));
        assertFalse(TicketMapping.leasable("random"));
        assertFalse(TicketMapping.leasable("consistent_hash"));
    }

    /** Each rule's local mapping against what rota's Pick answers for the same tickets, with and without exclude. */
    @Test
    @ExtendWith(SharedRotaServer.class)
    void localMappingMatchesRotasPick(RotaServer rota) throws Exception {
        String service = "mapping-vs-pick";
        int[] weights = {7, 3, 0, 5, 1};
        ManagedChannel channel = Grpc.newChannelBuilder(rota.target(), InsecureChannelCredentials.create()).build();
        try (RotaClient provider = RotaClient.builder().target(rota.target()).build()) {
            List<Instance> instances = IntStream.range(0, weights.length)
                    .mapToObj(i -> Instance.of(service, "127.0.0.1", 9000 + i).withId("m" + i).withWeight(weights[i]))
                    .toList();
            Registration registration = provider.register(instances);
            BalancerGrpc.BalancerBlockingStub balancer = BalancerGrpc.newBlockingStub(channel)
                    .withDeadlineAfter(20, TimeUnit.SECONDS);
            for (String rule : List.of("round_robin", "repeat(n=3)", "weighted")) {
                LeaseResponse list = balancer.lease(LeaseRequest.newBuilder().setService(service).setRule(rule).build());
                List<Member> members = list.getInstancesList().stream()
                        .map(i -> new Member(i.getId(), i.getHost(), i.getPort(), i.getVersion(), i.hasWeight() ? i.getWeight() : 100))
                        .toList();
                Eligible eligible = new Eligible(members, list.getRule());
                for (int n = 0; n < 40; n++) {
                    String exclude = n % 4 == 3 ? "m" + (n % weights.length) : null;
                    PickRequest.Builder request = PickRequest.newBuilder().setService(service).setRule(rule);
                    if (exclude != null) {
                        request.addExclude(exclude);
                    }
                    PickResponse pick = balancer.pick(request.build());
                    boolean[] excluded = exclude == null ? null : eligible.excluded(id -> !id.equals(exclude));
                    Member local = eligible.map(pick.getTicket(), excluded);
                    assertEquals(pick.getInstance().getId(), local.id(), rule + " ticket " + pick.getTicket()
                            + " exclude " + exclude + " over " + members.stream().map(Member::id).collect(Collectors.joining(",")));
                }
            }
            registration.close();
        } finally {
            channel.shutdownNow();
        }
    }
}
