package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BiPredicate;

import org.junit.jupiter.api.Test;

import io.grpc.Server;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.client.testing.Await;
import io.rota.v1.RegisterRequest;
import io.rota.v1.RegisterResponse;
import io.rota.v1.RegistryGrpc;

/**
 * A registration's re-announcement after a lost stream, against a scripted Register: an
 * instance that rota refuses for now (ALREADY_EXISTS) is retried but not listed as registered,
 * each new stream announces every instance once, and withdrawing a retried instance gives it up.
 */
class ReannounceTest {
    private static final Instance A = Instance.of("svc", "127.0.0.1", 9001).withId("a");
    private static final Instance B = A.withId("b").withPort(9002);
    private static final Duration WAIT = Duration.ofSeconds(20);

    /** One Register stream as the fake sees it: the ids of each announcement on it. */
    static final class FakeStream {
        final List<List<String>> announced = new CopyOnWriteArrayList<>();
        private final StreamObserver<RegisterResponse> responses;
        private boolean ended;

        FakeStream(StreamObserver<RegisterResponse> responses) {
            this.responses = responses;
        }

        synchronized void end() {
            if (!ended) {
                ended = true;
                responses.onCompleted();
            }
        }

        synchronized void answer(RegisterResponse response) {
            if (!ended) {
                responses.onNext(response);
            }
        }
    }

    /**
     * A Register that refuses an announced id when {@code refuse(stream index, id)} holds, and
     * the withdrawal of an id its stream does not hold with NOT_FOUND.
     */
    static final class ScriptedRota implements AutoCloseable {
        final List<FakeStream> streams = new CopyOnWriteArrayList<>();
        private final Server server;

        ScriptedRota(BiPredicate<Integer, String> refuse) throws IOException {
            server = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                    .addService(new RegistryGrpc.RegistryImplBase() {
                        @Override
                        public StreamObserver<RegisterRequest> register(StreamObserver<RegisterResponse> responses) {
                            FakeStream stream = new FakeStream(responses);
                            int index = streams.size();
                            streams.add(stream);
                            return new Answering(stream, index, refuse);
                        }
                    })
                    .build()
                    .start();
        }

        String target() {
            return "127.0.0.1:" + server.getPort();
        }

        FakeStream stream(int index) throws InterruptedException {
            Await.until("stream " + index, WAIT, () -> streams.size() > index);
            return streams.get(index);
        }

        @Override
        public void close() {
            server.shutdownNow();
            try {
                server.awaitTermination(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private static final class Answering implements StreamObserver<RegisterRequest> {
        private final FakeStream stream;
        private final int index;
        private final BiPredicate<Integer, String> refuse;
        private final Set<String> held = new HashSet<>();
        private long seq;

        Answering(FakeStream stream, int index, BiPredicate<Integer, String> refuse) {
            this.stream = stream;
            this.index = index;
            this.refuse = refuse;
        }

        @Override
        public synchronized void onNext(RegisterRequest request) {
            io.rota.v1.Ack.Builder ack = io.rota.v1.Ack.newBuilder().setLeaseId(index + 1).setHeartbeatTimeoutMs(300);
            switch (request.getMsgCase()) {
                case ANNOUNCE -> {
                    List<String> ids = new ArrayList<>();
                    for (io.rota.v1.Instance instance : request.getAnnounce().getInstancesList()) {
                        ids.add(instance.getId());
                    }
                    stream.announced.add(ids);
                    for (String id : ids) {
                        if (refuse.test(index, id)) {
                            ack.addRefused(refusal(id, Status.Code.ALREADY_EXISTS, "held by another lease"));
                        } else {
                            held.add(id);
                            ack.addAccepted(ref(id));
                        }
                    }
                }
                case WITHDRAW -> {
                    List<String> ids = new ArrayList<>();
                    for (io.rota.v1.InstanceRef ref : request.getWithdraw().getInstancesList()) {
                        ids.add(ref.getId());
                    }
                    if (ids.isEmpty()) {
                        ids.addAll(held);
                    }
                    for (String id : ids) {
                        if (held.remove(id)) {
                            ack.addAccepted(ref(id));
                        } else {
                            ack.addRefused(refusal(id, Status.Code.NOT_FOUND, "not on this lease"));
                        }
                    }
                }
                default -> {
                    return;
                }
            }
            seq++;
            stream.answer(RegisterResponse.newBuilder().setAck(ack.setSeq(seq)).build());
        }

        @Override
        public void onError(Throwable t) {
            stream.end();
        }

        @Override
        public void onCompleted() {
            stream.end();
        }

        private static io.rota.v1.InstanceRef ref(String id) {
            return io.rota.v1.InstanceRef.newBuilder().setService("svc").setId(id).build();
        }

        private static io.rota.v1.Refusal refusal(String id, Status.Code code, String message) {
            return io.rota.v1.Refusal.newBuilder().setInstance(ref(id)).setCode(code.value()).setMessage(message).build();
        }
    }

    private static RotaClient client(ScriptedRota rota) {
        return RotaClient.builder().target(rota.target())
                .backoff(Backoff.exponential(Duration.ofMillis(1), Duration.ofMillis(5))).build();
    }

    private static List<String> ids(Registration registration) {
        List<String> ids = new ArrayList<>();
        for (Instance instance : registration.instances()) {
            ids.add(instance.id());
        }
        return ids;
    }

    @Test
    void anInstanceRefusedForNowIsListedOnceAcceptedAndAnnouncedOncePerStream() throws Exception {
        // The second stream is refused "b"; the third is not.
        try (ScriptedRota rota = new ScriptedRota((stream, id) -> stream == 1 && id.equals("b"));
                RotaClient client = client(rota);
                Registration registration = client.register(A, B)) {
            rota.stream(0).end();
            FakeStream second = rota.stream(1);
            // A retry of "b" goes out once the refusal is recorded.
            Await.until("a retry of b", WAIT, () -> second.announced.size() >= 2);
            assertEquals(List.of(List.of("a", "b"), List.of("b")), second.announced.subList(0, 2));
            assertEquals(List.of("a"), ids(registration), "only what rota acknowledged");

            second.end();
            FakeStream third = rota.stream(2);
            Await.until("the third announcement", WAIT, () -> !third.announced.isEmpty());
            assertEquals(List.of("a", "b"), third.announced.get(0), "each instance once");
            Await.until("b registered again", WAIT, () -> ids(registration).size() == 2);
            assertEquals(Set.of("a", "b"), Set.copyOf(ids(registration)));
        }
    }

    @Test
    void withdrawingAnInstanceRefusedForNowGivesItUp() throws Exception {
        try (ScriptedRota rota = new ScriptedRota((stream, id) -> stream == 1 && id.equals("b"));
                RotaClient client = client(rota);
                Registration registration = client.register(A, B)) {
            rota.stream(0).end();
            FakeStream second = rota.stream(1);
            Await.until("a retry of b", WAIT, () -> second.announced.size() >= 2);
            Ack ack = registration.withdraw(B.ref());
            assertEquals(List.of(new Refusal(B.ref(), Status.Code.NOT_FOUND, "not on this lease")), ack.refused());

            second.end();
            FakeStream third = rota.stream(2);
            Await.until("the third announcement", WAIT, () -> !third.announced.isEmpty());
            assertEquals(List.of("a"), third.announced.get(0), "the withdrawn instance is not announced again");
            assertEquals(List.of("a"), ids(registration));
        }
    }
}
