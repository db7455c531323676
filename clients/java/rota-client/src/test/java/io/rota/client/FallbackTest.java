package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletionException;

import org.junit.jupiter.api.Test;

import io.grpc.Metadata;
import io.grpc.Status;
import io.rota.client.testing.Await;

/** The watch-fed local fallback is used on transport failures and expired deadlines, never on server answers. */
class FallbackTest {
    private static final Instance A = Instance.of("svc", "127.0.0.1", 9001).withId("a");
    private static final Instance B = A.withId("b").withPort(9002);
    private static final Instance Z = A.withId("z").withPort(9003).withVersion("zlt");
    private static final Instance D = A.withId("c").withPort(9004).withStatus(InstanceStatus.DOWN);

    private static RotaClient followingClient(FakeRota rota, Duration pickTimeout) throws InterruptedException {
        RotaClient client = RotaClient.builder().target(rota.target()).pickTimeout(pickTimeout).follow("svc").build();
        Await.until("the snapshot", Duration.ofSeconds(10), () -> client.lastKnownInstances("svc").size() == 4);
        return client;
    }

    @Test
    void serverAnswersAreThrownEvenWithACachedList() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(rota, Duration.ofSeconds(5))) {
                assertEquals(List.of("a", "b", "c", "z"), client.lastKnownInstances("svc").stream().map(Instance::id).toList());
                rota.onPick = request -> {
                    throw Status.UNAVAILABLE.withDescription("no eligible instance").asRuntimeException();
                };
                RotaException unavailable = assertThrows(RotaException.class, () -> client.pick("svc"));
                assertEquals(Status.Code.UNAVAILABLE, unavailable.getCode());
                assertEquals("no eligible instance", unavailable.getDescription());

                rota.onPick = request -> {
                    throw Status.NOT_FOUND.withDescription("never registered").asRuntimeException();
                };
                assertEquals(Status.Code.NOT_FOUND, assertThrows(RotaException.class, () -> client.pick("svc")).getCode());

                rota.onPick = request -> FakeRota.answer(B, 41);
                Pick pick = client.pick("svc");
                assertEquals("b", pick.id());
                assertEquals(41, pick.ticket());
                assertFalse(pick.localFallback());
            }
        }
    }

    @Test
    void unreachableRotaIsAnsweredFromTheCache() throws Exception {
        FakeRota rota = new FakeRota();
        rota.watched = List.of(A, B, D, Z);
        try (RotaClient client = followingClient(rota, Duration.ofSeconds(5))) {
            rota.close();
            Pick first = client.pick("svc");
            assertTrue(first.localFallback());
            assertEquals("a", first.id());
            assertEquals(4, first.epoch());
            assertEquals("b", client.pick("svc").id());
            assertEquals("a", client.pick("svc").id());
            Pick zlt = client.pick("svc", PickOptions.builder().version("zlt").build());
            assertEquals("z", zlt.id());
            assertTrue(zlt.localFallback());
            Pick unknown = client.pick("svc", PickOptions.builder().version("nobody").build());
            assertEquals("b", unknown.id());
            assertTrue(unknown.fallback().endsWith("no instance with version \"nobody\"; picked from instances with no version"),
                    unknown.fallback());
            Pick async = client.pickAsync("svc", PickOptions.defaults()).join();
            assertTrue(async.localFallback());
            assertEquals("a", async.id());

            RotaException notFollowed = assertThrows(RotaException.class, () -> client.pick("other"));
            assertEquals(Status.Code.UNAVAILABLE, notFollowed.getCode());
            CompletionException asyncFailure = assertThrows(CompletionException.class,
                    () -> client.pickAsync("other", PickOptions.defaults()).join());
            assertEquals(Status.Code.UNAVAILABLE, ((RotaException) asyncFailure.getCause()).getCode());
        }
    }

    @Test
    void anExpiredDeadlineCountsAsUnreachable() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(rota, Duration.ofMillis(300))) {
                rota.onPick = request -> null;
                Pick pick = client.pick("svc");
                assertTrue(pick.localFallback());
                assertEquals("a", pick.id());
                assertTrue(pick.fallback().startsWith("rota unreachable (DEADLINE_EXCEEDED"), pick.fallback());
            }
        }
    }

    @Test
    void onlyFailuresWithoutAnAnswerFromTheServerCountAsUnreachable() {
        Metadata answered = new Metadata();
        answered.put(Metadata.Key.of("content-type", Metadata.ASCII_STRING_MARSHALLER), "application/grpc");
        assertTrue(RotaClient.isTransportFailure(Status.UNAVAILABLE.withDescription("io exception").asRuntimeException()));
        assertTrue(RotaClient.isTransportFailure(Status.UNKNOWN.withDescription("channel closed").asRuntimeException(new Metadata())));
        assertTrue(RotaClient.isTransportFailure(Status.INTERNAL.withDescription("RST_STREAM").asRuntimeException()));
        assertTrue(RotaClient.isTransportFailure(Status.DEADLINE_EXCEEDED.asRuntimeException()));
        assertFalse(RotaClient.isTransportFailure(Status.UNAVAILABLE.withDescription("no instance").asRuntimeException(answered)));
        assertFalse(RotaClient.isTransportFailure(Status.UNKNOWN.asRuntimeException(answered)));
        assertFalse(RotaClient.isTransportFailure(Status.NOT_FOUND.asRuntimeException()));
        assertFalse(RotaClient.isTransportFailure(Status.INVALID_ARGUMENT.asRuntimeException()));
        assertFalse(RotaClient.isTransportFailure(Status.CANCELLED.asRuntimeException()));
    }

    @Test
    void nothingCachedMeansTheFailureIsThrown() throws Exception {
        FakeRota rota = new FakeRota();
        rota.watched = List.of(D);
        try (RotaClient client = RotaClient.builder().target(rota.target()).follow("svc").build()) {
            Await.until("the snapshot", Duration.ofSeconds(10), () -> client.lastKnownInstances("svc").size() == 1);
            rota.close();
            RotaException e = assertThrows(RotaException.class, () -> client.pick("svc"));
            assertEquals(Status.Code.UNAVAILABLE, e.getCode());
        }
    }
}
