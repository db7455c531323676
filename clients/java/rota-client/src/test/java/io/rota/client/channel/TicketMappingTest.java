package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
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

    /** Positions {@code t .. t+count-1} go to with {@code unusable}, as letters; '-' for none. */
    private static String spread(TicketMapping mapping, long from, int count, boolean[] unusable) {
        StringBuilder out = new StringBuilder();
        for (long t = from; t < from + count; t++) {
            int position = mapping.spread(t, unusable);
            out.append(position < 0 ? '-' : (char) ('A' + position));
        }
        return out.toString();
    }

    private static int[] counts(String letters, int n) {
        int[] counts = new int[n];
        letters.chars().forEach(c -> counts[c - 'A']++);
        return counts;
    }

    @Test
    void anUnusableInstancesTicketsAreSpreadEvenlyOverTheUsableOnes() {
        TicketMapping rr = TicketMapping.of("round_robin", new int[3]);
        boolean[] cDown = {false, false, true};
        // The unusable slot's tickets alternate between the others, cycle by cycle.
        assertEquals("ABAABB", spread(rr, 0, 6, cDown));
        String sixCycles = spread(rr, 0, 18, cDown);
        assertArrayEquals(new int[] {9, 9, 0}, counts(sixCycles, 3), sixCycles);
        // A ticket whose own instance is usable keeps it.
        for (long t = 0; t < 18; t++) {
            if (t % 3 != 2) {
                assertEquals(rr.map(t, null), rr.spread(t, cDown));
            }
        }
        assertEquals("ABCABC", spread(rr, 0, 6, null));
        assertEquals(-1, rr.spread(2, new boolean[] {true, true, true}));
        assertEquals(1, rr.spread(0, new boolean[] {true, false, true}));

        // Two of five unusable: over |A| = 3 cycles every usable slot takes |D| = 2 of their tickets.
        TicketMapping five = TicketMapping.of("round_robin", new int[5]);
        boolean[] twoDown = {false, true, false, true, false};
        String threeCycles = spread(five, 0, 15, twoDown);
        assertArrayEquals(new int[] {5, 0, 5, 0, 5}, counts(threeCycles, 5), threeCycles);
        String longer = spread(five, 7, 300, twoDown);
        assertArrayEquals(new int[] {100, 0, 100, 0, 100}, counts(longer, 5), longer);
    }

    @Test
    void repeatRunsStayWholeOnOneUsableInstance() {
        TicketMapping repeat = TicketMapping.of("repeat(n=3)", new int[3]);
        boolean[] cDown = {false, false, true};
        assertEquals("AAABBBAAA" + "AAABBBBBB", spread(repeat, 0, 18, cDown));
        String many = spread(repeat, 0, 3 * 3 * 40, cDown);
        for (int run = 0; run < many.length(); run += 3) {
            assertEquals(1, many.substring(run, run + 3).chars().distinct().count(), "run at " + run + ": " + many);
        }
        assertArrayEquals(new int[] {180, 180, 0}, counts(many, 3));
    }

    @Test
    void weightedKeepsTheUsableInstancesProportions() {
        // Schedule of 2:1:1 is A B C A (slots 0..3); C's one slot goes to A, B, A in turn.
        TicketMapping weighted = TicketMapping.of("weighted", new int[] {200, 100, 100});
        assertArrayEquals(new int[] {0, 1, 2, 0}, weighted.schedule());
        boolean[] cDown = {false, false, true};
        String threeCycles = spread(weighted, 0, 12, cDown);
        assertEquals("ABAA" + "ABBA" + "ABAA", threeCycles);
        assertArrayEquals(new int[] {8, 4, 0}, counts(threeCycles, 3));
        // 5:3:2 with the 3 unusable: A and B keep 5:2.
        TicketMapping uneven = TicketMapping.of("weighted", new int[] {5, 3, 2});
        boolean[] bDown = {false, true, false};
        String cycles = spread(uneven, 0, 10 * 7, bDown);
        assertArrayEquals(new int[] {50, 0, 20}, counts(cycles, 3), cycles);
    }

    @Test
    void spreadTicketsAreUnsignedAndTheSplitFollowsTheUnusableSet() {
        TicketMapping rr = TicketMapping.of("round_robin", new int[3]);
        // The top of the unsigned range: cycle (2^64-1)/3, slot 0.
        long top = -1L;
        assertEquals(0, Long.remainderUnsigned(top, 3));
        long cycle = Long.divideUnsigned(top, 3);
        assertEquals((int) Long.remainderUnsigned(cycle, 2) == 0 ? 1 : 2, rr.spread(top, new boolean[] {true, false, false}));
        // Another unusable set is another split, not the last one's.
        assertEquals("ABAABB", spread(rr, 0, 6, new boolean[] {false, false, true}));
        assertEquals("AACACC", spread(rr, 0, 6, new boolean[] {false, true, false}));
        assertEquals("ABAABB", spread(rr, 0, 6, new boolean[] {false, false, true}));
    }

    @Test
    void eligibleRoutesAUsableTicketToItsOwnInstanceAndSpreadsTheOthers() {
        Eligible eligible = new Eligible(List.of(new Member("a", "h", 1, "", 100), new Member("b", "h", 2, "", 100),
                new Member("c", "h", 3, "", 100)), "round_robin");
        StringBuilder out = new StringBuilder();
        for (long t = 0; t < 6; t++) {
            out.append(eligible.route(t, m -> !m.id().equals("c")).id());
        }
        assertEquals("abaabb", out.toString());
        assertNull(eligible.route(1, m -> false));
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
                    boolean[] excluded = exclude == null ? null : eligible.excluded(m -> !m.id().equals(exclude));
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
