package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import java.util.function.LongToIntFunction;
import java.util.function.Predicate;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;

/**
 * A rotation's draws against a stand-in for rota's Lease on a loopback port: every pick that
 * waits is picked again once the lease it waits for is in; each ticket goes to the position rota
 * leased it at; an answer that cannot be indexed is refused; an unusable instance's tickets are
 * passed over and named in the leases' exclude; the local rotation.
 */
class RotationTest {
    private static final Member A = new Member("echo-a", "127.0.0.1", 1, "", 100);
    private static final Member B = new Member("echo-b", "127.0.0.1", 2, "", 100);
    private static final Member C = new Member("echo-c", "127.0.0.1", 3, "", 100);

    private final AtomicLong counter = new AtomicLong();
    private volatile List<Member> listed = List.of(A);
    /** Where the stand-in puts ticket t over the list it answers with (round_robin unless a test says otherwise). */
    private volatile LongToIntFunction positions = null;
    /** What the stand-in answers instead of a well-formed lease, when set. */
    private volatile Function<LeaseRequest, LeaseResponse> override = null;
    /** Whether the stand-in leaves out of its list what the request excludes (rota does). */
    private volatile boolean honourExclude = true;
    /** Permits for answers while {@link #gated}; the others are answered at once. */
    private volatile boolean gated;
    private final Semaphore gate = new Semaphore(0);
    private final List<LeaseRequest> requests = new CopyOnWriteArrayList<>();
    private Server rota;

    @BeforeEach
    void start() throws Exception {
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new BalancerGrpc.BalancerImplBase() {
                    @Override
                    public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
                        requests.add(request);
                        if (gated) {
                            try {
                                if (!gate.tryAcquire(10, TimeUnit.SECONDS)) {
                                    response.onError(Status.DEADLINE_EXCEEDED.asRuntimeException());
                                    return;
                                }
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                                response.onError(Status.CANCELLED.asRuntimeException());
                                return;
                            }
                        }
                        if (override != null) {
                            LeaseResponse answer = override.apply(request);
                            if (answer == null) {
                                Metadata trailers = new Metadata();
                                trailers.put(Metadata.Key.of("rota-error", Metadata.ASCII_STRING_MARSHALLER), "no_eligible_instance");
                                response.onError(Status.UNAVAILABLE.withDescription("every eligible instance excluded")
                                        .asRuntimeException(trailers));
                                return;
                            }
                            response.onNext(answer);
                            response.onCompleted();
                            return;
                        }
                        List<Member> kept = listed.stream()
                                .filter(m -> !honourExclude || !request.getExcludeList().contains(m.id())).toList();
                        LongToIntFunction at = positions != null ? positions : t -> (int) (t % kept.size());
                        response.onNext(FakeLease.range(FakeLease.instances(kept), counter.getAndAdd(request.getCount()),
                                request.getCount(), "round_robin", at).build());
                        response.onCompleted();
                    }
                }).build().start();
    }

    @AfterEach
    void stop() {
        rota.shutdownNow();
    }

    private String target() {
        return "127.0.0.1:" + rota.getPort();
    }

    @Test
    void aFirstPickWaitsForTheLeaseAndIsPickedAgainWhenItIsIn() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A), repicks::release, m -> false);
            Rotation.Decision first = firstDraw(rotation, repicks, "the pick waiting for the first lease was not picked again");
            assertEquals(A, first.draw().member());
            assertEquals(0, first.draw().ticket());
        }
    }

    @Test
    void aFirstPickWhoseLeaseIsInBeforeTheLeaseCallReturnsIsNotLeftWaiting() throws Exception {
        // As when the picking thread loses its core right after starting the lease: the answer
        // has been handed to the call's future before the call returns to the rotation.
        AnswerBeforeReturn answerFirst = new AnswerBeforeReturn();
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo", RotaLink.REPORT_INTERVAL_MS, answerFirst)) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A), repicks::release, m -> false);
            Rotation.Decision first = firstDraw(rotation, repicks,
                    "the first pick waits for a lease that is already in, and nothing picks it again");
            assertTrue(answerFirst.answered.get(), "the lease was not answered while the call was held");
            assertEquals(A, first.draw().member());
            assertEquals(0, first.draw().ticket());
        }
    }

    @Test
    void aPickThatNoListedInstanceCanTakeIsPickedAgainWhenTheNewBlockIsIn() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(B), repicks::release, m -> false);
            Rotation.Decision first = firstDraw(rotation, repicks, "the pick waiting for the first lease was not picked again");
            assertEquals(A, first.draw().member());

            // echo-a left and echo-b joined; the new block is not in yet.
            listed = List.of(B);
            gated = true;
            rotation.refresh();
            repicks.drainPermits();
            Rotation.Decision stale = rotation.draw(m -> m.id().equals(B.id()));
            assertNull(stale.draw(), "the held tickets were dropped, the new block is not in");
            assertTrue(stale.failure() == null || stale.failure().isOk(), String.valueOf(stale.failure()));
            gated = false;
            gate.release(10);
            Rotation.Decision after = next(rotation, repicks, m -> m.id().equals(B.id()));
            assertNotNull(after.draw(), "the pick that echo-b can take was not picked again after the new block came in: " + after);
            assertEquals(B, after.draw().member());
        }
    }

    /** Draws {@code n} tickets; "id@ticket" (local ones "id@Lticket") each. */
    private static List<String> draws(Rotation rotation, int n, java.util.function.Predicate<Member> usable) {
        List<String> out = new java.util.ArrayList<>();
        for (int i = 0; i < n; i++) {
            Rotation.Draw draw = rotation.draw(usable).draw();
            assertNotNull(draw, "draw " + i);
            out.add(draw.member().id() + "@" + (draw.local() ? "L" : "") + draw.ticket());
        }
        return out;
    }

    /** The next draw, picked again (at most 4 rounds, each bounded) while it waits for a lease, as the channel's picker does. */
    private static Rotation.Decision next(Rotation rotation, Semaphore repicks, Predicate<Member> usable) throws InterruptedException {
        Rotation.Decision decision = rotation.draw(usable);
        for (int round = 0; decision.draw() == null && decision.failure() == null && round < 4; round++) {
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), "the waiting pick was not picked again");
            decision = rotation.draw(usable);
        }
        return decision;
    }

    /** {@code n} draws through {@link #next}, each one of a member. */
    private static List<Rotation.Draw> drawn(Rotation rotation, Semaphore repicks, int n, Predicate<Member> usable)
            throws InterruptedException {
        List<Rotation.Draw> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Rotation.Decision decision = next(rotation, repicks, usable);
            assertNotNull(decision.draw(), "draw " + i + ": " + decision);
            out.add(decision.draw());
        }
        return out;
    }

    private static Map<String, Integer> counts(List<Rotation.Draw> draws) {
        Map<String, Integer> out = new TreeMap<>();
        draws.forEach(d -> out.merge(d.member().id(), 1, Integer::sum));
        return out;
    }

    private static final Predicate<Member> NOT_C = m -> !m.id().equals(C.id());

    @Test
    void eachTicketGoesToThePositionRotaLeasedItAt() throws Exception {
        listed = List.of(A, B, C);
        // Not t mod 3: the channel indexes rota's positions, it does not map tickets itself.
        positions = t -> (int) ((t / 2 + t * t) % 3);
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, C), repicks::release, m -> false);
            List<Rotation.Draw> draws = drawn(rotation, repicks, 40, m -> true);
            for (int i = 0; i < draws.size(); i++) {
                long t = draws.get(i).ticket();
                assertEquals(i, t, "tickets in order, none passed over");
                assertEquals(listed.get((int) ((t / 2 + t * t) % 3)), draws.get(i).member(), "ticket " + t);
                assertEquals("round_robin", draws.get(i).rule());
            }
        }
    }

    @Test
    void anAnswerThatCannotBeIndexedIsRefused() throws Exception {
        listed = List.of(A, B, C);
        Map<Function<LeaseRequest, LeaseResponse>, String> bad = new java.util.LinkedHashMap<>();
        // One position short.
        bad.put(request -> {
            LeaseResponse.Builder answer = FakeLease.range(FakeLease.instances(listed), 0, request.getCount(), "round_robin", t -> 0);
            List<Integer> all = List.copyOf(answer.getPositionsList());
            return answer.clearPositions().addAllPositions(all.subList(1, all.size())).build();
        }, "15 positions for 16 tickets");
        // A position past the list.
        bad.put(request -> FakeLease.range(FakeLease.instances(listed), 0, request.getCount(), "round_robin",
                t -> t == 5 ? 3 : 0).build(), "ticket 5 at position 3 of a list of 3 instances");
        for (Map.Entry<Function<LeaseRequest, LeaseResponse>, String> answer : bad.entrySet()) {
            override = answer.getKey();
            Semaphore repicks = new Semaphore(0);
            try (RotaLink link = new RotaLink(target(), "echo")) {
                Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, C), repicks::release, m -> false);
                Rotation.Decision decision = next(rotation, repicks, m -> true);
                assertNull(decision.draw(), "a draw from an answer that cannot be indexed: " + decision.draw());
                assertEquals(Status.Code.INTERNAL, decision.failure().getCode(), String.valueOf(decision.failure()));
                assertTrue(decision.failure().getDescription().contains(answer.getValue()), decision.failure().getDescription());
                assertTrue(!rotation.inOutage(), "refused, not unreachable");
            }
        }
    }

    @Test
    void roundRobinPassesOverAnUnusableInstancesTicketsAndTheOthersShareEqually() throws Exception {
        listed = List.of(A, B, C);
        honourExclude = false;
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, C), repicks::release, NOT_C.negate());
            List<Rotation.Draw> draws = drawn(rotation, repicks, 30, NOT_C);
            assertEquals(Map.of("echo-a", 15, "echo-b", 15), counts(draws));
            long previous = -1;
            for (Rotation.Draw d : draws) {
                assertEquals(listed.get((int) (d.ticket() % 3)), d.member(), "ticket " + d.ticket());
                for (long skipped = previous + 1; skipped < d.ticket(); skipped++) {
                    assertEquals(2, skipped % 3, "ticket " + skipped + " of a usable instance passed over");
                }
                previous = d.ticket();
            }
            // Every lease told rota which instance the channel cannot use.
            assertTrue(!requests.isEmpty());
            assertTrue(requests.stream().allMatch(r -> r.getExcludeList().equals(List.of("echo-c"))), requests.toString());
        }
    }

    @Test
    void repeatRunsOfAnUnusableInstanceArePassedOverWhole() throws Exception {
        listed = List.of(A, B, C);
        honourExclude = false;
        positions = t -> (int) ((t / 3) % 3);
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "repeat(n=3)", "", () -> List.of(A, B, C), repicks::release, NOT_C.negate());
            List<Rotation.Draw> draws = drawn(rotation, repicks, 36, NOT_C);
            assertEquals(Map.of("echo-a", 18, "echo-b", 18), counts(draws));
            Map<Long, List<Rotation.Draw>> runs = new TreeMap<>();
            draws.forEach(d -> runs.computeIfAbsent(d.ticket() / 3, k -> new ArrayList<>()).add(d));
            runs.forEach((run, in) -> {
                assertEquals(3, in.size(), "run " + run + " not whole: " + in);
                assertEquals(1, in.stream().map(Rotation.Draw::member).distinct().count(), "run " + run);
                assertTrue(run % 3 != 2, "a run of echo-c's was sent: " + run);
            });
        }
    }

    @Test
    void weightedKeepsTheUsableInstancesProportions() throws Exception {
        Member a = new Member("echo-a", "127.0.0.1", 1, "", 200);
        listed = List.of(a, B, C);
        honourExclude = false;
        // rota's schedule of 2:1:1 is a, b, c, a.
        RuleOracle weighted = new RuleOracle("weighted", new int[] {200, 100, 100});
        positions = weighted::position;
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "weighted", "", () -> List.of(a, B, C), repicks::release, NOT_C.negate());
            List<Rotation.Draw> draws = drawn(rotation, repicks, 30, NOT_C);
            assertEquals(Map.of("echo-a", 20, "echo-b", 10), counts(draws));
        }
    }

    @Test
    void leasesExcludeAtMostAThousandUnusableInstancesInIdOrder() throws Exception {
        List<Member> many = new ArrayList<>();
        for (int i = 1199; i >= 0; i--) {
            many.add(new Member(String.format("m%04d", i), "127.0.0.1", 1000 + i, "", 100));
        }
        Member only = many.get(many.size() - 1);
        listed = List.of(only);
        Predicate<Member> usable = m -> m.equals(only);
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> many, repicks::release, usable.negate());
            drawn(rotation, repicks, 20, usable);
            List<String> wanted = new ArrayList<>();
            for (int i = 1; i <= 1000; i++) {
                wanted.add(String.format("m%04d", i));
            }
            assertTrue(requests.size() > 1, "one lease only: " + requests.size());
            requests.forEach(r -> assertEquals(wanted, r.getExcludeList()));
        }
    }

    @Test
    void aLeaseRefusedForExcludingEveryInstanceIsAskedAgainWithoutExclude() throws Exception {
        listed = List.of(A, B);
        override = request -> request.getExcludeCount() > 0 ? null
                : FakeLease.range(FakeLease.instances(listed), 0, request.getCount(), "round_robin", t -> (int) (t % 2)).build();
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B), repicks::release, m -> true);
            Rotation.Decision decision = next(rotation, repicks, m -> false);
            assertSame(Rotation.Decision.NONE_USABLE, decision, "no instance is usable: the picker decides");
            assertEquals(List.of(List.of("echo-a", "echo-b"), List.of()),
                    requests.stream().map(LeaseRequest::getExcludeList).toList());
            assertTrue(!rotation.inOutage(), "a refusal of the exclude is no outage");
        }
    }

    @Test
    void anInstanceTheHeldBlockExcludedIsLeasedAgainWhenItIsTheOnlyUsableOne() throws Exception {
        listed = List.of(A, B);
        Semaphore repicks = new Semaphore(0);
        java.util.concurrent.atomic.AtomicReference<String> down = new java.util.concurrent.atomic.AtomicReference<>("echo-a");
        Predicate<Member> usable = m -> !m.id().equals(down.get());
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B), repicks::release, usable.negate());
            // echo-a is down: the block is leased without it.
            assertEquals(B, next(rotation, repicks, usable).draw().member());
            assertEquals(List.of("echo-a"), requests.get(0).getExcludeList());
            // Now echo-b is down and echo-a back: the held block lists echo-b only, and a new
            // block (excluding echo-b) is leased rather than failing the RPC.
            down.set("echo-b");
            Rotation.Decision decision = next(rotation, repicks, usable);
            assertNotNull(decision.draw(), String.valueOf(decision));
            assertEquals(A, decision.draw().member());
            assertEquals(List.of("echo-b"), requests.get(requests.size() - 1).getExcludeList());
        }
    }

    @Test
    void aDrawWhoseBlocksHoldNoUsableTicketWaitsForTheNextLeaseInsteadOfLooping() throws Exception {
        listed = List.of(A, B, C);
        honourExclude = false;
        positions = t -> 2;
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, C), repicks::release, m -> false);
            for (int i = 0; i < 5; i++) {
                int asked = requests.size();
                Rotation.Decision decision = rotation.draw(NOT_C);
                assertSame(Rotation.Decision.WAIT, decision, "draw " + i);
                assertTrue(requests.size() - asked <= 2, "one draw leased " + (requests.size() - asked) + " blocks");
                assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), "the waiting pick was not picked again");
            }
        }
    }

    @Test
    void theLocalRotationGoesOverTheUsableInstancesOneCallEachInIdOrder() throws Exception {
        Semaphore repicks = new Semaphore(0);
        // Nothing listens at rota's address: the first lease fails, and the rotation goes local
        // over the resolver's list (no lease seen), in id order, echo-c unusable.
        try (RotaLink link = new RotaLink("127.0.0.1:" + EchoFleet.unreachablePort(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(C, A, B), repicks::release, NOT_C.negate());
            Rotation.Decision first = rotation.draw(m -> true);
            if (first.draw() == null) {
                assertSame(Rotation.Decision.WAIT, first);
                assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), "the failed lease did not ask for a pick again");
            }
            assertTrue(rotation.inOutage());
            List<String> got = draws(rotation, 12, NOT_C);
            long turn = Long.parseLong(got.get(0).substring(got.get(0).indexOf("@L") + 2));
            List<String> expected = new ArrayList<>();
            for (long t = turn; t < turn + 12; t++) {
                expected.add((t % 2 == 0 ? "echo-a" : "echo-b") + "@L" + t);
            }
            assertEquals(expected, got);
        }
    }

    @Test
    void theLocalRotationAfterLeasesIsPlainOverTheLastLeasedList() throws Exception {
        Member heavy = new Member("echo-a", "127.0.0.1", 1, "", 500);
        listed = List.of(heavy, B, C);
        positions = new RuleOracle("weighted", new int[] {500, 100, 100})::position;
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "weighted", "", () -> List.of(heavy, B), repicks::release, m -> false);
            drawn(rotation, repicks, 3, m -> true);
            // rota goes away (its leases fail from now on) and the watch says so.
            rota.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
            rotation.lost();
            // Weights are not kept while rota is away: one call each, in id order, over the last
            // leased list (echo-c too, which the resolver no longer lists).
            List<String> got = draws(rotation, 9, m -> true);
            long turn = Long.parseLong(got.get(0).substring(got.get(0).indexOf("@L") + 2));
            List<String> expected = new ArrayList<>();
            for (long t = turn; t < turn + 9; t++) {
                expected.add(List.of("echo-a", "echo-b", "echo-c").get((int) (t % 3)) + "@L" + t);
            }
            assertEquals(expected, got);
        }
    }

    /** The first draw: at once, or after the rotation asks for a pick again. */
    private static Rotation.Decision firstDraw(Rotation rotation, Semaphore repicks, String stuck) throws InterruptedException {
        Rotation.Decision first = rotation.draw(m -> true);
        if (first.draw() == null) {
            assertSame(Rotation.Decision.WAIT, first);
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), stuck);
            first = rotation.draw(m -> true);
        }
        assertNotNull(first.draw());
        return first;
    }

    /** Holds the caller in the Lease call until the answer has been handed to the call's listener (at most 10 s). */
    private static final class AnswerBeforeReturn implements ClientInterceptor {
        final AtomicBoolean answered = new AtomicBoolean();

        @Override
        public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
            CountDownLatch closed = new CountDownLatch(1);
            return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
                @Override
                public void start(Listener<R> listener, Metadata headers) {
                    super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(listener) {
                        @Override
                        public void onClose(Status status, Metadata trailers) {
                            super.onClose(status, trailers);
                            closed.countDown();
                        }
                    }, headers);
                }

                @Override
                public void halfClose() {
                    super.halfClose();
                    try {
                        if (closed.await(10, TimeUnit.SECONDS)) {
                            answered.set(true);
                        }
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
            };
        }
    }
}
