package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

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
import io.rota.v1.Instance;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;

/**
 * A rotation's picks that wait for a lease, against a stand-in for rota's Lease on a loopback
 * port: every pick that waits is picked again once the lease it waits for is in.
 */
class RotationTest {
    private static final Member A = new Member("echo-a", "127.0.0.1", 1, "", 100);
    private static final Member B = new Member("echo-b", "127.0.0.1", 2, "", 100);
    private static final Member C = new Member("echo-c", "127.0.0.1", 3, "", 100);

    private final AtomicLong counter = new AtomicLong();
    private volatile List<Member> listed = List.of(A);
    /** Permits for answers to list-only leases (count 0); the others are answered at once. */
    private final Semaphore refreshes = new Semaphore(Integer.MAX_VALUE);
    private Server rota;

    @BeforeEach
    void start() throws Exception {
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new BalancerGrpc.BalancerImplBase() {
                    @Override
                    public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
                        if (request.getCount() == 0) {
                            try {
                                if (!refreshes.tryAcquire(10, TimeUnit.SECONDS)) {
                                    response.onError(Status.DEADLINE_EXCEEDED.asRuntimeException());
                                    return;
                                }
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                                response.onError(Status.CANCELLED.asRuntimeException());
                                return;
                            }
                        }
                        LeaseResponse.Builder answer = LeaseResponse.newBuilder()
                                .setFirstTicket(counter.getAndAdd(request.getCount())).setCount(request.getCount())
                                .setRule("round_robin");
                        for (Member m : listed) {
                            answer.addInstances(Instance.newBuilder().setId(m.id()).setHost(m.host()).setPort(m.port()));
                        }
                        response.onNext(answer.build());
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
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A), repicks::release);
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
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A), repicks::release);
            Rotation.Decision first = firstDraw(rotation, repicks,
                    "the first pick waits for a lease that is already in, and nothing picks it again");
            assertTrue(answerFirst.answered.get(), "the lease was not answered while the call was held");
            assertEquals(A, first.draw().member());
            assertEquals(0, first.draw().ticket());
        }
    }

    @Test
    void aPickThatNoListedInstanceCanTakeIsPickedAgainWhenTheRefreshedListIsIn() throws Exception {
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(B), repicks::release);
            Rotation.Decision first = firstDraw(rotation, repicks, "the pick waiting for the first lease was not picked again");
            assertEquals(A, first.draw().member());

            // echo-a left and echo-b joined; the refreshed list is not in yet.
            listed = List.of(B);
            refreshes.drainPermits();
            rotation.refresh();
            repicks.drainPermits();
            Rotation.Decision stale = rotation.draw(m -> m.id().equals(B.id()));
            assertNull(stale.draw(), "echo-b is not on the list leased so far");
            assertTrue(stale.failure() == null || stale.failure().isOk(), String.valueOf(stale.failure()));
            refreshes.release();
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS),
                    "the pick that echo-b can take was not picked again after the refreshed list came in");
            Rotation.Decision after = rotation.draw(m -> m.id().equals(B.id()));
            assertNotNull(after.draw());
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

    @Test
    void aLeasedTicketWhoseInstanceIsUnusableGoesToAUsableOneItself() throws Exception {
        listed = List.of(A, B, C);
        Semaphore repicks = new Semaphore(0);
        try (RotaLink link = new RotaLink(target(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(A, B, C), repicks::release);
            firstDraw(rotation, repicks, "the pick waiting for the first lease was not picked again");
            // Tickets 1.., echo-c unusable: its tickets alternate between echo-a and echo-b, and
            // no ticket is passed over.
            assertEquals(List.of("echo-b@1", "echo-a@2", "echo-a@3", "echo-b@4", "echo-b@5", "echo-a@6", "echo-b@7",
                    "echo-a@8", "echo-a@9"), draws(rotation, 9, m -> !m.id().equals(C.id())));
        }
    }

    @Test
    void theLocalRotationSpreadsAnUnusableInstancesTurnsTheSameWay() throws Exception {
        Semaphore repicks = new Semaphore(0);
        // Nothing listens at rota's address: the first lease fails, and the rotation goes local.
        try (RotaLink link = new RotaLink("127.0.0.1:" + EchoFleet.unreachablePort(), "echo")) {
            Rotation rotation = new Rotation(link, "round_robin", "", () -> List.of(C, A, B), repicks::release);
            Rotation.Decision first = rotation.draw(m -> true);
            if (first.draw() == null) {
                assertSame(Rotation.Decision.WAIT, first);
                assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), "the failed lease did not ask for a pick again");
            }
            assertTrue(rotation.inOutage());
            List<String> got = draws(rotation, 12, m -> !m.id().equals(C.id()));
            long turn = Long.parseLong(got.get(0).substring(got.get(0).indexOf("@L") + 2));
            List<String> expected = new java.util.ArrayList<>();
            for (long t = turn; t < turn + 12; t++) {
                // Over the isolated list in id order (a, b, c): c's turns alternate between a and b.
                String id = t % 3 == 0 ? "echo-a" : t % 3 == 1 ? "echo-b" : (t / 3) % 2 == 0 ? "echo-a" : "echo-b";
                expected.add(id + "@L" + t);
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
