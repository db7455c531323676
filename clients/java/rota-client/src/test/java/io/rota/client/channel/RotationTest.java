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
            Rotation.Decision stale = rotation.draw(id -> id.equals(B.id()));
            assertNull(stale.draw(), "echo-b is not on the list leased so far");
            assertTrue(stale.failure() == null || stale.failure().isOk(), String.valueOf(stale.failure()));
            refreshes.release();
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS),
                    "the pick that echo-b can take was not picked again after the refreshed list came in");
            Rotation.Decision after = rotation.draw(id -> id.equals(B.id()));
            assertNotNull(after.draw());
            assertEquals(B, after.draw().member());
        }
    }

    /** The first draw: at once, or after the rotation asks for a pick again. */
    private static Rotation.Decision firstDraw(Rotation rotation, Semaphore repicks, String stuck) throws InterruptedException {
        Rotation.Decision first = rotation.draw(id -> true);
        if (first.draw() == null) {
            assertSame(Rotation.Decision.WAIT, first);
            assertTrue(repicks.tryAcquire(10, TimeUnit.SECONDS), stuck);
            first = rotation.draw(id -> true);
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
