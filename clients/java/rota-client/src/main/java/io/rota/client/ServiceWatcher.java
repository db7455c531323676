package io.rota.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.List;
import java.util.TreeMap;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

import io.grpc.Context;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;

/**
 * Follows one service through {@code Watch} and keeps its last known instance list, which
 * survives the loss of the stream (that is its purpose). Reconnects with backoff; the backoff
 * starts over only after a stream lived {@link #STABLE_STREAM}, so a server that accepts a watch
 * and ends it at once (a draining rota) is not asked again at the pace of the first retry.
 *
 * <p>An empty snapshot at epoch 0 (what a rota that has not seen the service since it started
 * would send) never replaces a non-empty list: its providers have not registered again yet, and
 * the list is what the local fallback picks from. An empty snapshot at a later epoch is rota's
 * word and applied.
 */
final class ServiceWatcher {
    private static final System.Logger LOG = System.getLogger(ServiceWatcher.class.getName());
    /** How long a stream must have lived for its end to start the backoff over. */
    static final Duration STABLE_STREAM = Duration.ofSeconds(5);

    /** The instance list as last seen, ordered by id, and its epoch. */
    record Snapshot(List<Instance> instances, long epoch, boolean synced) {
    }

    private final String service;
    private final RegistryGrpc.RegistryStub stub;
    private final ScheduledExecutorService scheduler;
    private final Backoff backoff;
    private final Runnable beforeReconnect;
    private final Runnable onSnapshot;

    private final Object lock = new Object();
    private final TreeMap<String, Instance> instances = new TreeMap<>();
    private long epoch;
    private boolean synced;
    private boolean closed;
    private int failures;
    private ClientCallStreamObserver<WatchRequest> call;
    private ScheduledFuture<?> retry;
    /** {@link System#nanoTime()} when the current stream was opened. */
    private long openedAt;

    ServiceWatcher(String service, RegistryGrpc.RegistryStub stub, ScheduledExecutorService scheduler, Backoff backoff,
            Runnable beforeReconnect, Runnable onSnapshot) {
        this.service = service;
        this.stub = stub;
        this.scheduler = scheduler;
        this.backoff = backoff;
        this.beforeReconnect = beforeReconnect;
        this.onSnapshot = onSnapshot;
    }

    String service() {
        return service;
    }

    void start() {
        synchronized (lock) {
            if (closed) {
                return;
            }
            Observer observer = new Observer();
            openedAt = System.nanoTime();
            // A watch outlives whatever call started it: never inherit its cancellation.
            Context.ROOT.run(() -> stub.watch(WatchRequest.newBuilder().setService(service).build(), observer));
        }
    }

    Snapshot snapshot() {
        synchronized (lock) {
            return new Snapshot(List.copyOf(instances.values()), epoch, synced);
        }
    }

    void close() {
        synchronized (lock) {
            closed = true;
            if (retry != null) {
                retry.cancel(false);
            }
            if (call != null) {
                call.cancel("watcher closed", null);
            }
        }
    }

    private void apply(WatchEvent event) {
        synchronized (lock) {
            switch (event.getEventCase()) {
                case SNAPSHOT -> {
                    if (event.getSnapshot().getInstancesCount() == 0 && event.getEpoch() == 0 && !instances.isEmpty()) {
                        LOG.log(Level.DEBUG, () -> "keeping the " + instances.size() + " instances of " + service
                                + " rather than an empty snapshot at epoch 0 (a restarted rota)");
                        return;
                    }
                    instances.clear();
                    for (io.rota.v1.Instance instance : event.getSnapshot().getInstancesList()) {
                        instances.put(instance.getId(), Wire.instance(instance));
                    }
                    synced = true;
                }
                case ADDED -> instances.put(event.getAdded().getId(), Wire.instance(event.getAdded()));
                case UPDATED -> instances.put(event.getUpdated().getId(), Wire.instance(event.getUpdated()));
                case REMOVED -> instances.remove(event.getRemoved().getId());
                case EVENT_NOT_SET -> {
                    return;
                }
            }
            epoch = event.getEpoch();
        }
    }

    private void ended(Observer observer, Status status) {
        synchronized (lock) {
            if (closed || observer.call != call) {
                return;
            }
            call = null;
            if (System.nanoTime() - openedAt >= STABLE_STREAM.toNanos()) {
                failures = 0;
            }
            Duration delay = backoff.delay(Math.min(failures, 30));
            failures++;
            LOG.log(Level.DEBUG, () -> "watch of " + service + " ended (" + RotaException.describe(status) + "); keeping " + instances.size()
                    + " instances, retrying in " + delay.toMillis() + " ms");
            retry = scheduler.schedule(this::reconnect, delay.toNanos(), TimeUnit.NANOSECONDS);
        }
    }

    private void reconnect() {
        synchronized (lock) {
            if (closed) {
                return;
            }
        }
        // The watch has its own backoff; the channel must not add its own on top.
        beforeReconnect.run();
        start();
    }

    /** How many times in a row the stream ended before living {@link #STABLE_STREAM}. */
    int failures() {
        synchronized (lock) {
            return failures;
        }
    }

    private final class Observer implements ClientResponseObserver<WatchRequest, WatchEvent> {
        private ClientCallStreamObserver<WatchRequest> call;

        @Override
        public void beforeStart(ClientCallStreamObserver<WatchRequest> requestStream) {
            this.call = requestStream;
            ServiceWatcher.this.call = requestStream;
        }

        @Override
        public void onNext(WatchEvent event) {
            apply(event);
            if (event.hasSnapshot()) {
                // A snapshot is rota answering: it is reachable again.
                onSnapshot.run();
            }
        }

        @Override
        public void onError(Throwable t) {
            ended(this, Status.fromThrowable(t));
        }

        @Override
        public void onCompleted() {
            ended(this, Status.OK);
        }

        @Override
        public String toString() {
            return "watch(" + service + ")";
        }
    }

    @Override
    public String toString() {
        return "ServiceWatcher{" + service + "}";
    }
}
