package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.client.testing.RotaServer;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.PickRequest;
import io.rota.v1.PickResponse;

/**
 * Many PickRequests pipelined on one {@code PickStream} (sent without waiting for the answers,
 * which another thread reads as they come) on the connection that also carries the client's
 * {@code Register} stream.
 */
class PickStreamPipelineTest {
    private static final int N = 20_000;
    private static final List<String> IDS = List.of("a", "b", "c");

    private static Instance instance(String service, String id, int port) {
        return Instance.of(service, "127.0.0.1", port).withId(id);
    }

    @Test
    @Timeout(value = 60, unit = TimeUnit.SECONDS)
    void answersPipelinedRequestsInOrderAndTheConnectionSurvives() throws Exception {
        String service = "it-pipeline";
        try (RotaServer rota = RotaServer.start();
                RotaClient client = RotaClient.builder().target(rota.target()).build();
                Registration registration = client.register(instance(service, "a", 9001), instance(service, "b", 9002),
                        instance(service, "c", 9003))) {
            long lease = registration.leaseId();

            Object ready = new Object();
            List<PickResponse> responses = new ArrayList<>(N);
            CompletableFuture<Void> done = new CompletableFuture<>();
            ClientResponseObserver<PickRequest, PickResponse> reader = new ClientResponseObserver<>() {
                @Override
                public void beforeStart(ClientCallStreamObserver<PickRequest> requests) {
                    requests.setOnReadyHandler(() -> {
                        synchronized (ready) {
                            ready.notifyAll();
                        }
                    });
                }

                @Override
                public void onNext(PickResponse response) {
                    synchronized (responses) {
                        responses.add(response);
                    }
                }

                @Override
                public void onError(Throwable t) {
                    done.completeExceptionally(t);
                    synchronized (ready) {
                        ready.notifyAll();
                    }
                }

                @Override
                public void onCompleted() {
                    done.complete(null);
                }
            };
            @SuppressWarnings("unchecked")
            ClientCallStreamObserver<PickRequest> requests = (ClientCallStreamObserver<PickRequest>) BalancerGrpc
                    .newStub(client.channel()).pickStream(reader);

            // The writer: as fast as the stream takes them, waiting only while its buffer is full.
            PickRequest request = PickRequest.newBuilder().setService(service).setRule("round_robin").build();
            long start = System.nanoTime();
            long deadline = start + TimeUnit.SECONDS.toNanos(50);
            for (int i = 0; i < N && !done.isDone(); i++) {
                synchronized (ready) {
                    while (!requests.isReady() && !done.isDone()) {
                        long left = deadline - System.nanoTime();
                        if (left <= 0) {
                            fail("the stream took " + i + " of " + N + " requests in 50 s");
                        }
                        ready.wait(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left)));
                    }
                }
                if (!done.isDone()) {
                    requests.onNext(request);
                }
            }
            if (!done.isDone()) {
                requests.onCompleted();
            }
            try {
                done.get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (ExecutionException | TimeoutException e) {
                int received;
                synchronized (responses) {
                    received = responses.size();
                }
                fail("after " + received + " of " + N + " responses ("
                        + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms): "
                        + (e instanceof ExecutionException ? e.getCause() : e), e);
            }

            List<PickResponse> answered;
            synchronized (responses) {
                answered = List.copyOf(responses);
            }
            assertEquals(N, answered.size());
            Map<String, Integer> counts = new HashMap<>();
            for (int i = 0; i < N; i++) {
                PickResponse response = answered.get(i);
                assertFalse(response.hasError(), "response " + i + " carries an error: " + response.getError());
                assertEquals(i, response.getTicket(), "ticket of response " + i);
                String id = response.getInstance().getId();
                assertEquals(IDS.get(i % IDS.size()), id, "instance of ticket " + i + " by round robin");
                counts.merge(id, 1, Integer::sum);
            }
            for (String id : IDS) {
                int count = counts.getOrDefault(id, 0);
                assertTrue(Math.abs(count - N / IDS.size()) <= 1, id + " picked " + count + " times, want "
                        + N / IDS.size() + " ± 1");
            }

            // The registration's stream lived through the burst: an update is acknowledged on it.
            InstanceRef c = new InstanceRef(service, "c");
            Ack ack = registration.update(Update.of(c).withStatus(InstanceStatus.DRAINING));
            assertEquals(List.of(c), ack.accepted());
            assertEquals(lease, ack.leaseId());
            assertEquals(lease, registration.leaseId());
            assertEquals(0, registration.reconnects());
        }
    }
}
