package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import org.junit.jupiter.api.Test;

import io.grpc.Metadata;
import io.grpc.Status;
import io.rota.client.testing.Await;
import io.rota.v1.InstanceList;
import io.rota.v1.WatchEvent;

/**
 * The watch-fed local fallback answers when rota's answer cannot be had (transport failure,
 * expired deadline) or is {@code warming_up}, never instead of any other answer of rota's.
 */
class FallbackTest {
    private static final Instance A = Instance.of("svc", "127.0.0.1", 9001).withId("a");
    private static final Instance B = A.withId("b").withPort(9002);
    private static final Instance Z = A.withId("z").withPort(9003).withVersion("zlt");
    private static final Instance D = A.withId("c").withPort(9004).withStatus(InstanceStatus.DOWN);
    private static final Duration WAIT = Duration.ofSeconds(20);

    private static RotaClient followingClient(FakeRota rota, Duration pickTimeout) throws InterruptedException {
        return followingClient(RotaClient.builder().target(rota.target()).pickTimeout(pickTimeout));
    }

    private static RotaClient followingClient(RotaClient.Builder builder) throws InterruptedException {
        RotaClient client = builder.follow("svc").build();
        Await.until("the snapshot", WAIT, () -> client.lastKnownInstances("svc").size() == 4);
        return client;
    }

    @Test
    void serverAnswersAreThrownEvenWithACachedList() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(rota, Duration.ofSeconds(5))) {
                assertEquals(List.of("a", "b", "c", "z"), client.lastKnownInstances("svc").stream().map(Instance::id).toList());
                rota.onPick = request -> {
                    throw FakeRota.refusal(Status.UNAVAILABLE.withDescription("no eligible instance"), "no_eligible_instance");
                };
                RotaException unavailable = assertThrows(RotaException.class, () -> client.pick("svc"));
                assertEquals(Status.Code.UNAVAILABLE, unavailable.getCode());
                assertEquals("no eligible instance", unavailable.getDescription());
                assertEquals("no_eligible_instance", unavailable.reason());
                assertFalse(unavailable.isUnreachable());

                rota.onPick = request -> {
                    throw FakeRota.refusal(Status.NOT_FOUND.withDescription("never registered"), "unknown_service");
                };
                RotaException notFound = assertThrows(RotaException.class, () -> client.pick("svc"));
                assertEquals(Status.Code.NOT_FOUND, notFound.getCode());
                assertEquals("unknown_service", notFound.reason());

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
            List<Pick> picks = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                picks.add(client.pick("svc"));
            }
            assertEquals(List.of("a", "b", "a"), picks.stream().map(Pick::id).toList());
            assertEquals(List.of(0L, 1L, 2L), picks.stream().map(Pick::ticket).toList());
            for (Pick p : picks) {
                assertTrue(p.localFallback());
                assertEquals("", p.fallback());
                assertFalse(p.isFallback());
                assertEquals("round_robin", p.rule());
                assertEquals(4, p.epoch());
            }
            Pick zlt = client.pick("svc", PickOptions.builder().version("zlt").build());
            assertEquals("z", zlt.id());
            assertEquals(0, zlt.ticket());
            assertTrue(zlt.localFallback());
            Pick unknown = client.pick("svc", PickOptions.builder().version("nobody").build());
            assertEquals("b", unknown.id());
            assertEquals(3, unknown.ticket());
            assertEquals("no instance with version \"nobody\"; picked from instances with no version", unknown.fallback());
            Pick async = client.pickAsync("svc", PickOptions.defaults()).join();
            assertTrue(async.localFallback());
            assertEquals("a", async.id());

            RotaException excluded = assertThrows(RotaException.class,
                    () -> client.pick("svc", PickOptions.builder().version("zlt").exclude(List.of("z")).build()));
            assertEquals(Status.Code.UNAVAILABLE, excluded.getCode());
            assertEquals("no_eligible_instance", excluded.reason());

            RotaException notFollowed = assertThrows(RotaException.class, () -> client.pick("other"));
            assertEquals(Status.Code.UNAVAILABLE, notFollowed.getCode());
            assertTrue(notFollowed.isUnreachable());
            CompletionException asyncFailure = assertThrows(CompletionException.class,
                    () -> client.pickAsync("other", PickOptions.defaults()).join());
            assertTrue(((RotaException) asyncFailure.getCause()).isUnreachable());
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
                assertEquals("", pick.fallback());
            }
        }
    }

    @Test
    void warmingUpIsAnsweredFromTheCache() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(rota, Duration.ofSeconds(5))) {
                rota.onPick = request -> {
                    throw FakeRota.refusal(Status.UNAVAILABLE.withDescription("rota is warming up"), "warming_up");
                };
                Pick pick = client.pick("svc");
                assertTrue(pick.localFallback());
                assertTrue(pick.isLocalFallback());
                assertEquals("a", pick.id());
                assertEquals(0, pick.ticket());
            }
        }
    }

    @Test
    void anEmptySnapshotAtEpochZeroKeepsTheListOneAtALaterEpochReplacesIt() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(rota, Duration.ofSeconds(5))) {
                // An empty snapshot at epoch 0 (a restarted rota), then an added instance to know
                // the snapshot was handled.
                Instance n = A.withId("n").withPort(9005);
                rota.push(WatchEvent.newBuilder().setSnapshot(InstanceList.getDefaultInstance()).setEpoch(0).build());
                rota.push(WatchEvent.newBuilder().setAdded(Wire.instance(n)).setEpoch(1).build());
                Await.until("the added instance", WAIT, () -> client.lastKnownInstances("svc").size() == 5);
                assertEquals(List.of("a", "b", "c", "n", "z"),
                        client.lastKnownInstances("svc").stream().map(Instance::id).toList());

                // An empty snapshot at a later epoch is rota's word.
                rota.push(WatchEvent.newBuilder().setSnapshot(InstanceList.getDefaultInstance()).setEpoch(7).build());
                rota.push(WatchEvent.newBuilder().setAdded(Wire.instance(n)).setEpoch(8).build());
                Await.until("the list to be just the added instance", WAIT,
                        () -> client.lastKnownInstances("svc").stream().map(Instance::id).toList().equals(List.of("n")));
            }
        }
    }

    @Test
    void repeatedFailuresShortCutToTheFallbackThenRotaIsAskedAgain() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            // A window far longer than the test: picks inside it must not reach rota at all.
            try (RotaClient client = followingClient(RotaClient.builder().target(rota.target())
                    .pickTimeout(Duration.ofMillis(200)).shortCut(Duration.ofMinutes(5)))) {
                rota.onPick = request -> null;
                for (int i = 0; i < RotaClient.UNREACHABLE_STREAK; i++) {
                    assertTrue(client.pick("svc").localFallback());
                }
                assertEquals(RotaClient.UNREACHABLE_STREAK, rota.picks.size());
                for (int i = 0; i < 10; i++) {
                    assertTrue(client.pick("svc").localFallback());
                }
                assertTrue(client.pickAsync("svc", PickOptions.defaults()).join().localFallback());
                assertEquals(RotaClient.UNREACHABLE_STREAK, rota.picks.size(), "picks that reached rota");
            }
        }
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            // A deadline no pick of this test gets near, even on a loaded machine: the failures
            // come from an UNAVAILABLE without rota's reason, as a proxy with no rota behind it answers.
            try (RotaClient client = followingClient(RotaClient.builder().target(rota.target())
                    .pickTimeout(Duration.ofSeconds(30)).shortCut(Duration.ofMillis(100)))) {
                rota.onPick = request -> {
                    throw Status.UNAVAILABLE.withDescription("no rota behind this proxy").asRuntimeException();
                };
                for (int i = 0; i < RotaClient.UNREACHABLE_STREAK; i++) {
                    assertTrue(client.pick("svc").localFallback());
                }
                rota.onPick = request -> FakeRota.answer(Z, 7);
                // Past the window rota is asked again, and its answer ends the short-cut.
                Await.until("a pick answered by rota", WAIT, () -> !client.pick("svc").localFallback());
                assertEquals(RotaClient.UNREACHABLE_STREAK + 1, rota.picks.size());
                assertFalse(client.pick("svc").localFallback());
            }
        }
    }

    @Test
    void oneWarningPerOutageAndOneNoticeOnRecovery() throws Exception {
        Logger log = Logger.getLogger(RotaClient.class.getName());
        List<LogRecord> records = new ArrayList<>();
        Handler capture = new Handler() {
            @Override
            public synchronized void publish(LogRecord record) {
                records.add(record);
            }

            @Override
            public void flush() {
            }

            @Override
            public void close() {
            }
        };
        Level level = log.getLevel();
        log.setLevel(Level.ALL);
        log.addHandler(capture);
        AtomicInteger localPicks = new AtomicInteger();
        List<String> firstLocal = new ArrayList<>();
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A, B, D, Z);
            try (RotaClient client = followingClient(RotaClient.builder().target(rota.target())
                    .pickTimeout(Duration.ofSeconds(5)).shortCut(Duration.ofMillis(1)))) {
                for (int outage = 0; outage < 2; outage++) {
                    // Local picks alternate a and b (c is down, z has a version); each outage's
                    // first one follows from how many were made before it.
                    firstLocal.add(localPicks.get() % 2 == 0 ? "a" : "b");
                    rota.onPick = request -> {
                        throw FakeRota.refusal(Status.UNAVAILABLE, "warming_up");
                    };
                    for (int i = 0; i < 20; i++) {
                        assertTrue(client.pick("svc").localFallback());
                        localPicks.incrementAndGet();
                    }
                    rota.onPick = request -> FakeRota.answer(B, 0);
                    // Until the short cut ends, a pick may still be answered locally.
                    Await.until("rota's answer", WAIT, () -> {
                        boolean local = client.pick("svc").localFallback();
                        if (local) {
                            localPicks.incrementAndGet();
                        }
                        return !local;
                    });
                    client.pick("svc");
                }
            }
        } finally {
            log.removeHandler(capture);
            log.setLevel(level);
        }
        List<String> logged;
        synchronized (capture) {
            logged = records.stream().map(r -> r.getLevel() + " " + r.getMessage()).toList();
        }
        assertEquals(4, logged.size(), String.join("\n", logged));
        for (int i = 0; i < 4; i += 2) {
            assertTrue(logged.get(i).startsWith("WARNING rota unreachable"), logged.get(i));
            assertTrue(logged.get(i).contains("svc -> " + firstLocal.get(i / 2)), logged.get(i));
            assertTrue(logged.get(i + 1).startsWith("INFO rota reachable again"), logged.get(i + 1));
        }
    }

    @Test
    void aWatchThatEndsRightAfterItsSnapshotDoesNotResetTheBackoff() throws Exception {
        try (FakeRota rota = new FakeRota()) {
            rota.watched = List.of(A);
            rota.endWatchesAfterSnapshot = true;
            try (RotaClient client = RotaClient.builder().target(rota.target())
                    .backoff(Backoff.exponential(Duration.ofMillis(1), Duration.ofMillis(5))).follow("svc").build()) {
                ServiceWatcher watcher = client.watcher("svc");
                Await.until("five watches ended in a row", WAIT, () -> watcher.failures() >= 5);
                assertEquals(List.of("a"), client.lastKnownInstances("svc").stream().map(Instance::id).toList());
            }
        }
    }

    /** The definition every client shares: clients/conformance/README.md, "Unreachable". */
    @Test
    void whatCountsAsUnreachable() {
        Metadata answered = new Metadata();
        answered.put(Metadata.Key.of("content-type", Metadata.ASCII_STRING_MARSHALLER), "application/grpc");
        // UNAVAILABLE or DEADLINE_EXCEEDED without rota's reason, whoever sent it (a proxy with
        // no rota behind it answers with headers of its own).
        assertTrue(RotaException.from(Status.UNAVAILABLE.withDescription("io exception").asRuntimeException()).isUnreachable());
        assertTrue(RotaException.from(Status.DEADLINE_EXCEEDED.asRuntimeException()).isUnreachable());
        assertTrue(RotaException.from(Status.UNAVAILABLE.asRuntimeException(answered)).isUnreachable());
        assertTrue(RotaException.from(Status.DEADLINE_EXCEEDED.asRuntimeException(answered)).isUnreachable());
        // A connection that broke under the call, as grpc-java reports it, is reported UNAVAILABLE.
        RotaException closed = RotaException.from(Status.UNKNOWN.withDescription("channel closed")
                .asRuntimeException(new Metadata()));
        assertTrue(closed.isUnreachable());
        assertEquals(Status.Code.UNAVAILABLE, closed.getCode());
        RotaException reset = RotaException.from(Status.INTERNAL.withDescription("RST_STREAM").asRuntimeException());
        assertTrue(reset.isUnreachable());
        assertEquals(Status.Code.UNAVAILABLE, reset.getCode());
        assertTrue(reset.getDescription().contains("RST_STREAM"), reset.getDescription());

        // Warming up is rota's answer: not unreachable, but it falls back all the same.
        RotaException warming = RotaException.from(FakeRota.refusal(Status.UNAVAILABLE, "warming_up"));
        assertFalse(warming.isUnreachable());
        assertTrue(warming.fallsBack());
        assertEquals(RotaException.WARMING_UP, warming.reason());

        RotaException noneEligible = RotaException.from(FakeRota.refusal(Status.UNAVAILABLE, "no_eligible_instance"));
        assertFalse(noneEligible.isUnreachable());
        assertFalse(noneEligible.fallsBack());
        assertEquals("no_eligible_instance", noneEligible.reason());
        RotaException unknownService = RotaException.from(FakeRota.refusal(Status.NOT_FOUND, "unknown_service"));
        assertFalse(unknownService.isUnreachable());
        assertFalse(unknownService.fallsBack());
        assertFalse(RotaException.from(Status.UNKNOWN.asRuntimeException(answered)).isUnreachable());
        assertFalse(RotaException.from(Status.INTERNAL.asRuntimeException(answered)).isUnreachable());
        assertFalse(RotaException.from(Status.NOT_FOUND.asRuntimeException()).isUnreachable());
        assertFalse(RotaException.from(Status.INVALID_ARGUMENT.asRuntimeException()).isUnreachable());
        assertFalse(RotaException.from(Status.CANCELLED.asRuntimeException()).isUnreachable());
        assertTrue(RotaException.from(Status.DEADLINE_EXCEEDED.asRuntimeException()).fallsBack());
        assertEquals("", RotaException.from(Status.UNAVAILABLE.asRuntimeException()).reason());
    }

    @Test
    void nothingCachedMeansTheFailureIsThrown() throws Exception {
        FakeRota rota = new FakeRota();
        rota.watched = List.of(D);
        try (RotaClient client = RotaClient.builder().target(rota.target()).follow("svc").build()) {
            Await.until("the snapshot", WAIT, () -> client.lastKnownInstances("svc").size() == 1);
            rota.close();
            RotaException e = assertThrows(RotaException.class, () -> client.pick("svc"));
            assertEquals(Status.Code.UNAVAILABLE, e.getCode());
        }
    }
}
