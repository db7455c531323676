package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

import io.grpc.Status;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;

/** {@link RotaClient#watch}: the iterator and the listener against a live rota, and their errors. */
@ExtendWith(SharedRotaServer.class)
class WatchTest {
    private static final Duration WAIT = Duration.ofSeconds(10);

    private static Instance instance(String service, String id, int port) {
        return Instance.of(service, "127.0.0.1", port).withId(id);
    }

    private static WatchEvent next(WatchStream events) {
        return events.poll(WAIT).orElseThrow(() -> new AssertionError("no watch event within " + WAIT));
    }

    @Test
    void theIteratorGivesTheSnapshotThenEveryChange(RotaServer rota) {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            Registration first = client.register(instance("watch-it", "a", 7601));
            try (WatchStream events = client.watch("watch-it")) {
                WatchEvent.Snapshot snapshot = assertInstanceOf(WatchEvent.Snapshot.class, next(events));
                assertEquals(List.of("a"), snapshot.instances().stream().map(Instance::id).toList());
                assertEquals(7601, snapshot.instances().get(0).port());

                Registration second = client.register(instance("watch-it", "b", 7602));
                WatchEvent.Added added = assertInstanceOf(WatchEvent.Added.class, next(events));
                assertEquals("b", added.instance().id());
                assertEquals("watch-it", added.instance().service());
                assertTrue(Long.compareUnsigned(added.epoch(), snapshot.epoch()) > 0, added + " after " + snapshot);

                second.update(Update.of(new InstanceRef("watch-it", "b")).withStatus(InstanceStatus.DRAINING));
                WatchEvent.Updated updated = assertInstanceOf(WatchEvent.Updated.class, next(events));
                assertEquals(InstanceStatus.DRAINING, updated.instance().status());

                second.close();
                WatchEvent.Removed removed = assertInstanceOf(WatchEvent.Removed.class, next(events));
                assertEquals(new InstanceRef("watch-it", "b"), removed.instance());

                events.close();
                assertFalse(events.hasNext());
                assertThrows(NoSuchElementException.class, events::next);
            } finally {
                first.close();
            }
        }
    }

    @Test
    void theListenerGetsTheEventsInOrderUntilClosed(RotaServer rota) throws Exception {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build()) {
            LinkedBlockingQueue<WatchEvent> seen = new LinkedBlockingQueue<>();
            Watch watch = client.watch("watch-listener", seen::add);
            WatchEvent.Snapshot snapshot = assertInstanceOf(WatchEvent.Snapshot.class, seen.poll(10, TimeUnit.SECONDS));
            assertEquals(List.of(), snapshot.instances());
            try (Registration registration = client.register(instance("watch-listener", "a", 7611))) {
                WatchEvent added = seen.poll(10, TimeUnit.SECONDS);
                assertEquals("a", assertInstanceOf(WatchEvent.Added.class, added).instance().id());
                assertTrue(watch.isOpen());
                watch.close();
                assertFalse(watch.isOpen());
                watch.done().get(10, TimeUnit.SECONDS);
            }
        }
    }

    @Test
    void aRefusedWatchFailsWithRotasStatus(RotaServer rota) {
        try (RotaClient client = RotaClient.builder().target(rota.target()).build();
                WatchStream events = client.watch("not a service name!")) {
            RotaException e = assertThrows(RotaException.class, events::hasNext);
            assertEquals(Status.Code.INVALID_ARGUMENT, e.getCode());
            assertFalse(e.isUnreachable());
        }
    }

    @Test
    void anUnreachableRotaFailsTheWatchNamingItsAddress() throws Exception {
        int port;
        try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            port = socket.getLocalPort();
        }
        String target = "127.0.0.1:" + port;
        try (RotaClient client = RotaClient.builder().target(target).build()) {
            CompletableFuture<RotaException> failed = new CompletableFuture<>();
            Watch watch = client.watch("watch-unreachable", new WatchListener() {
                @Override
                public void onEvent(WatchEvent event) {
                    failed.completeExceptionally(new AssertionError("an event from a closed port: " + event));
                }

                @Override
                public void onError(RotaException error) {
                    failed.complete(error);
                }
            });
            RotaException e = failed.get(10, TimeUnit.SECONDS);
            assertTrue(e.isUnreachable());
            assertEquals(Status.Code.UNAVAILABLE, e.getCode());
            assertTrue(e.getMessage().contains("rota at " + target + " unreachable: connection refused"), e.getMessage());
            assertFalse(watch.isOpen());
            ExecutionException done = assertThrows(ExecutionException.class, () -> watch.done().get(10, TimeUnit.SECONDS));
            assertInstanceOf(RotaException.class, done.getCause());
        }
    }
}
