package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.Instance;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.LeasedPick;

/**
 * A rotation whose leases come back as picks (rota's answer for a service under gray release
 * leased without a version), against a stand-in for rota's Lease on a loopback port.
 */
class PicksRotationTest {
    private static final Member A = new Member("echo-a", "127.0.0.1", 1, "", 100);
    private static final Member B = new Member("echo-b", "127.0.0.1", 2, "", 100);
    private static final Member V = new Member("echo-v", "127.0.0.1", 3, "v2", 100);

    /** Answers with picks while true, with a ticket range over {@link #listed} otherwise. */
    private volatile boolean gray = true;
    private volatile List<Member> listed = List.of(A, B, V);
    /** Ticket counters of the unversioned and the v2 rotation. */
    private final AtomicLong unversioned = new AtomicLong();
    private final AtomicLong v2 = new AtomicLong();
    /** Ticket ranges start at 1000, so that a draw shows which shape it came from. */
    private final AtomicLong ranges = new AtomicLong(1000);
    /** Picks handed out so far: pick k goes to v2 when k mod 3 is 2. */
    private final AtomicLong picked = new AtomicLong();
    private final List<Integer> asked = new CopyOnWriteArrayList<>();
    private Server rota;

    @BeforeEach
    void start() throws Exception {
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new BalancerGrpc.BalancerImplBase() {
                    @Override
                    public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
                        asked.add(request.getCount());
                        List<Member> members = listed;
                        LeaseResponse.Builder answer = LeaseResponse.newBuilder().setRule("round_robin");
                        for (Member m : members) {
                            answer.addInstances(Instance.newBuilder().setId(m.id()).setHost(m.host()).setPort(m.port())
                                    .setVersion(m.version()));
                        }
                        if (gray) {
                            // The split 2:1 of the scenario: unversioned, unversioned, v2, ...
                            List<Integer> unversionedAt = new ArrayList<>();
                            int v2At = -1;
                            for (int i = 0; i < members.size(); i++) {
                                if (members.get(i).version().isEmpty()) {
                                    unversionedAt.add(i);
                                } else {
                                    v2At = i;
                                }
                            }
                            for (int i = 0; i < request.getCount(); i++) {
                                if (picked.getAndIncrement() % 3 == 2 && v2At >= 0) {
                                    answer.addPicks(LeasedPick.newBuilder().setTicket(v2.getAndIncrement()).setPosition(v2At));
                                } else {
                                    long t = unversioned.getAndIncrement();
                                    answer.addPicks(LeasedPick.newBuilder().setTicket(t)
                                            .setPosition(unversionedAt.get((int) (t % unversionedAt.size()))));
                                }
                            }
                            answer.setFirstTicket(0).setCount(answer.getPicksCount());
                        } else {
                            // At most 4 tickets per lease, so that a change of shape shows within a few draws.
                            int count = Math.min(4, request.getCount());
                            long first = ranges.getAndAdd(count);
                            answer.setFirstTicket(first).setCount(count);
                            for (long t = first; t < first + count; t++) {
                                answer.addPositions((int) (t % members.size()));
                            }
                        }
                        response.onNext(answer.build());
                        response.onCompleted();
                    }
                }).build().start();
        // One Lease first, on a channel of its own: a cold JVM's first RPC (class loading, the
        // event loop) must not eat the rotation's lease deadline and turn it local.
        io.grpc.ManagedChannel warm = io.grpc.ManagedChannelBuilder.forTarget(target()).usePlaintext().build();
        try {
            BalancerGrpc.newBlockingStub(warm).withDeadlineAfter(30, TimeUnit.SECONDS)
                    .lease(LeaseRequest.newBuilder().setService("echo").build());
        } finally {
            warm.shutdownNow();
        }
        asked.clear();
    }

    @AfterEach
    void stop() {
        rota.shutdownNow();
    }

    private String target() {
        return "127.0.0.1:" + rota.getPort();
    }

    /**
     * The next draw, picked again each time a lease comes in while it waits, as the channel's
     * picker does. A lease that lands can leave the pick waiting still (an answer to a lease
     * asked before a refresh is dropped, and the refresh's own lease is then in flight), so a
     * few rounds are allowed, each bounded.
     */
    private static Rotation.Draw draw(Rotation rotation, Semaphore repicks, Predicate<Member> usable) throws InterruptedException {
        Rotation.Decision decision = rotation.draw(usable);
        for (int round = 0; decision.draw() == null && round < 4; round++) {
            assertSame(Rotation.Decision.WAIT, decision);
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), "the waiting pick was not picked again");
            decision = rotation.draw(usable);
        }
        assertNotNull(decision.draw(), String.valueOf(decision));
        assertTrue(!decision.draw().local(), "a local pick: the lease failed");
        return decision.draw();
    }

    @Test
    void picksAreUsedInOrderWithTheirOwnTickets() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, V), repicks::release, m -> false);
            List<String> ids = new ArrayList<>();
            List<Long> tickets = new ArrayList<>();
            for (int i = 0; i < 60; i++) {
                Rotation.Draw d = draw(rotation, repicks, m -> true);
                ids.add(d.member().id());
                tickets.add(d.ticket());
                assertEquals("round_robin", d.rule());
                assertTrue(!d.local());
            }
            assertEquals(List.of("echo-a", "echo-b", "echo-v", "echo-a", "echo-b", "echo-v"), ids.subList(0, 6));
            assertEquals(List.of(0L, 1L, 0L, 2L, 3L, 1L), tickets.subList(0, 6));
            assertEquals(20, ids.stream().filter("echo-v"::equals).count());
            assertEquals(20, ids.stream().filter("echo-a"::equals).count());
            // Prefetched: more than one lease, none of a list only.
            assertTrue(asked.size() > 1 && asked.stream().allMatch(c -> c > 0), asked.toString());
        }
    }

    @Test
    void aPickWhoseInstanceIsNotUsableIsAGapAndTheNextPickIsTaken() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, V), repicks::release, m -> false);
            Predicate<Member> noV = m -> !m.id().equals("echo-v");
            List<String> ids = new ArrayList<>();
            List<Long> tickets = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                Rotation.Draw d = draw(rotation, repicks, noV);
                ids.add(d.member().id());
                tickets.add(d.ticket());
            }
            // echo-v's pick (v2 ticket 0) was skipped; the unversioned rotation is whole.
            assertEquals(List.of("echo-a", "echo-b", "echo-a", "echo-b"), ids);
            assertEquals(List.of(0L, 1L, 2L, 3L), tickets);
            Rotation.Draw after = draw(rotation, repicks, m -> true);
            assertEquals("echo-v", after.member().id(), after + " after " + ids + " " + tickets + " asked " + asked);
            assertEquals(1, after.ticket(), "the skipped v2 pick is a gap, not reused");
        }
    }

    @Test
    void heldPicksAreDroppedWhenTheInstanceListChanges() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, V), repicks::release, m -> false);
            assertEquals("echo-a", draw(rotation, repicks, m -> true).member().id());
            long drawnUnversioned = unversioned.get();
            assertTrue(drawnUnversioned > 1, "the first block holds more picks than the one drawn");

            // echo-b leaves: the picks held (some naming echo-b) are dropped, a new block leased.
            listed = List.of(A, V);
            int before = asked.size();
            repicks.drainPermits();
            rotation.refresh();
            List<String> ids = new ArrayList<>();
            List<Long> tickets = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                Rotation.Draw d = draw(rotation, repicks, m -> !m.id().equals("echo-b"));
                ids.add(d.member().id());
                tickets.add(d.ticket());
            }
            assertTrue(asked.subList(before, asked.size()).stream().anyMatch(c -> c > 0),
                    "no new block was leased after the change: " + asked);
            assertTrue(ids.contains("echo-a") && ids.contains("echo-v") && !ids.contains("echo-b"), ids.toString());
            assertTrue(tickets.contains(drawnUnversioned), "the draws after the change are not of the new block: " + tickets);
        }
    }

    @Test
    void bothAnswerShapesAreTakenAsTheyCome() throws Exception {
        Semaphore repicks = new Semaphore(0);
        gray = false;
        listed = List.of(A, B);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B), repicks::release, m -> false);
            Rotation.Draw first = draw(rotation, repicks, m -> true);
            assertEquals(1000, first.ticket());
            assertEquals("echo-a", first.member().id());
            assertEquals("echo-b", draw(rotation, repicks, m -> true).member().id());

            // An operator sets a gray split: the next leases come back as picks.
            gray = true;
            listed = List.of(A, B, V);
            repicks.drainPermits();
            rotation.refresh();
            List<String> ids = new ArrayList<>();
            List<Long> tickets = new ArrayList<>();
            for (int i = 0; i < 200; i++) {
                Rotation.Draw d = draw(rotation, repicks, m -> true);
                ids.add(d.member().id());
                tickets.add(d.ticket());
            }
            // Once picks are in use, the split holds: the last 30 draws are picks, a third to echo-v.
            List<String> tail = ids.subList(ids.size() - 30, ids.size());
            assertTrue(tickets.subList(tickets.size() - 30, tickets.size()).stream().allMatch(t -> t < 1000), tickets.toString());
            assertEquals(10, tail.stream().filter("echo-v"::equals).count(), tail.toString());
            assertEquals(10, tail.stream().filter("echo-a"::equals).count(), tail.toString());
        }
    }
}
