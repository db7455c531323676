package io.rota.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Consumer;

import io.grpc.Context;
import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.v1.Announce;
import io.rota.v1.Heartbeat;
import io.rota.v1.RegisterRequest;
import io.rota.v1.RegisterResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.Withdraw;

/**
 * A provider's registration: its instances stay registered while this object is open.
 *
 * <p>The registration keeps one {@code Register} stream open and sends a heartbeat every third
 * of the server's heartbeat timeout. When the stream is lost (rota restarts, the network drops,
 * the server expires the lease) it reconnects with exponential backoff and full jitter and
 * announces the same instances again, with any status, weight or metadata changes made since.
 * {@link #close()} withdraws every instance, waits briefly for the acknowledgement and ends the
 * stream.
 *
 * <pre>{@code
 * try (Registration registration = client.register(List.of(instance))) {
 *     server.awaitTermination();
 * }
 * }</pre>
 *
 * <p>Thread-safe. {@link #announce}, {@link #update} and {@link #withdraw} send one message on
 * the current stream and wait for its {@link Ack}; they fail with {@code UNAVAILABLE} while the
 * registration is reconnecting.
 */
public final class Registration implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(Registration.class.getName());

    /** Heartbeats per heartbeat timeout, so that two may be lost in a row. */
    private static final int HEARTBEATS_PER_TIMEOUT = 3;
    private static final int MAX_BACKOFF_ATTEMPT = 30;

    private final RegistryGrpc.RegistryStub stub;
    private final ScheduledExecutorService scheduler;
    private final Backoff backoff;
    private final Duration ackTimeout;
    private final Duration withdrawTimeout;
    private final Runnable beforeReconnect;
    private final Consumer<Registration> onClose;

    private final Object lock = new Object();
    /** The instances asked for before the first acknowledgement. */
    private final List<Instance> initial;
    /** Registered instances by "service/id", as they should be announced again after a reconnect. */
    private final Map<String, Instance> instances = new LinkedHashMap<>();
    /**
     * Instances by "service/id" that a re-announcement found still owned by the lost stream;
     * retried with heartbeats. An instance is in {@link #instances} or here, never both.
     */
    private final Map<String, Instance> unconfirmed = new LinkedHashMap<>();
    private final CompletableFuture<Ack> firstAck = new CompletableFuture<>();
    private Stream current;
    private boolean closed;
    private int failures;
    /** Why the last stream was lost (guarded by lock), for the error of a registration that never got an ack. */
    private String lastFailure;
    private int reconnects;
    private long heartbeatsSent;
    private long heartbeatIntervalMs;
    private ScheduledFuture<?> heartbeat;
    private ScheduledFuture<?> retry;

    Registration(RegistryGrpc.RegistryStub stub, ScheduledExecutorService scheduler, Backoff backoff,
            Duration ackTimeout, Duration withdrawTimeout, Runnable beforeReconnect, Consumer<Registration> onClose,
            List<Instance> instances) {
        this.stub = stub;
        this.scheduler = scheduler;
        this.backoff = backoff;
        this.ackTimeout = ackTimeout;
        this.withdrawTimeout = withdrawTimeout;
        this.beforeReconnect = beforeReconnect;
        this.onClose = onClose;
        this.initial = List.copyOf(instances);
    }

    void start() {
        synchronized (lock) {
            connect();
        }
    }

    /**
     * Completes with the acknowledgement of the first announcement (after reconnecting as often
     * as needed), or exceptionally when the server refuses the stream itself or the registration
     * is closed first.
     */
    public CompletableFuture<Ack> ready() {
        return firstAck.copy();
    }

    /**
     * The acknowledgement of the first announcement (which instances were accepted and which
     * refused), or {@code null} while it has not come yet.
     */
    public Ack ack() {
        try {
            return firstAck.getNow(null);
        } catch (RuntimeException e) {
            return null;
        }
    }

    /**
     * The instances registered now (accepted, not withdrawn), as they would be announced again;
     * one whose re-announcement rota refused for now is left out until rota accepts it.
     */
    public List<Instance> instances() {
        synchronized (lock) {
            return List.copyOf(instances.values());
        }
    }

    /** Whether a stream is open now (false while reconnecting and after {@link #close()}). */
    public boolean isConnected() {
        synchronized (lock) {
            return current != null && !closed;
        }
    }

    /** The lease of the current stream, 0 while reconnecting. */
    public long leaseId() {
        synchronized (lock) {
            return current == null ? 0 : current.leaseId;
        }
    }

    /** How many times the stream was opened again after being lost. */
    public int reconnects() {
        synchronized (lock) {
            return reconnects;
        }
    }

    /** How many heartbeats (or re-announcements in their place) were sent, over every stream. */
    long heartbeatsSent() {
        synchronized (lock) {
            return heartbeatsSent;
        }
    }

    /** Adds instances to this registration; announcing an id it already owns replaces it. */
    public Ack announce(Instance... instances) {
        return announce(List.of(instances));
    }

    public Ack announce(Collection<Instance> announced) {
        List<Instance> list = List.copyOf(announced);
        return await(send(announcement(list), ack -> remember(list, ack, false)));
    }

    /** Changes one instance owned by this registration (status, weight, metadata). */
    public Ack update(Update update) {
        return await(send(RegisterRequest.newBuilder().setUpdate(Wire.update(update)).build(),
                ack -> applyUpdate(update, ack)));
    }

    /** Withdraws the named instances, or every instance when none is named; the stream stays open. */
    public Ack withdraw(InstanceRef... refs) {
        return withdraw(List.of(refs));
    }

    public Ack withdraw(Collection<InstanceRef> refs) {
        List<InstanceRef> list = List.copyOf(refs);
        return await(send(RegisterRequest.newBuilder()
                .setWithdraw(Withdraw.newBuilder().addAllInstances(Wire.refs(list))).build(),
                ack -> forget(list, ack)));
    }

    private static RegisterRequest announcement(List<Instance> instances) {
        return RegisterRequest.newBuilder().setAnnounce(Announce.newBuilder().addAllInstances(Wire.instances(instances)))
                .build();
    }

    /**
     * Withdraws every instance (waiting for the acknowledgement at most the client's withdraw
     * timeout) and ends the stream. Idempotent.
     */
    @Override
    public void close() {
        Stream stream;
        boolean announcing = false;
        CompletableFuture<Ack> withdrawn = null;
        synchronized (lock) {
            if (closed) {
                return;
            }
            closed = true;
            cancelTimers();
            stream = current;
            current = null;
            if (stream != null && (!stream.acked || !instances.isEmpty())) {
                // Also when the stream's announcement (the first one, or a re-announcement after
                // a reconnect) is still unanswered: rota answers in order, so this withdrawal
                // removes whatever that announcement registers.
                announcing = !stream.acked;
                withdrawn = stream.send(RegisterRequest.newBuilder().setWithdraw(Withdraw.getDefaultInstance()).build(),
                        ack -> forget(List.of(), ack));
            }
        }
        boolean acknowledged = false;
        if (withdrawn != null) {
            try {
                withdrawn.get(withdrawTimeout.toNanos(), TimeUnit.NANOSECONDS);
                acknowledged = true;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } catch (ExecutionException | TimeoutException e) {
                LOG.log(Level.DEBUG, () -> "withdraw on close not acknowledged: " + e);
            }
        }
        if (stream != null) {
            if (announcing && !acknowledged) {
                // rota was not reached in time: ending the stream removes whatever it registered.
                synchronized (lock) {
                    stream.cancel();
                }
            } else {
                stream.finish();
            }
        }
        firstAck.completeExceptionally(new RotaException(Status.Code.CANCELLED, "registration closed"));
        onClose.accept(this);
    }

    // --- streams -------------------------------------------------------------------------------

    /** Opens a stream and announces what should be registered. Holds the lock. */
    private void connect() {
        if (closed) {
            return;
        }
        Stream stream = new Stream();
        current = stream;
        // The stream outlives whatever call opened the registration: never inherit its cancellation.
        Context.ROOT.run(() -> stub.register(stream));
        if (!firstAck.isDone()) {
            stream.send(announcement(initial), ack -> {
                remember(initial, ack, false);
                firstAck.complete(ack);
            });
        } else {
            List<Instance> all = new ArrayList<>(instances.values());
            all.addAll(unconfirmed.values());
            stream.send(announcement(all), ack -> remember(all, ack, true));
        }
    }

    private void streamEnded(Stream stream, Status status, String closingReason) {
        List<CompletableFuture<Ack>> orphans;
        boolean wasCurrent;
        synchronized (lock) {
            // Also for a stream that close() took over: what still waits on it fails now rather
            // than at the end of close()'s timeout.
            orphans = stream.drain();
            wasCurrent = stream == current;
            if (wasCurrent) {
                current = null;
                cancelTimers();
                if (!closed) {
                    Duration delay = backoff.delay(Math.min(failures, MAX_BACKOFF_ATTEMPT));
                    String why = closingReason != null ? "server closed it: " + closingReason : RotaException.describe(status);
                    lastFailure = closingReason != null ? why : describeFailure(status);
                    // Once per outage at WARNING; the failed attempts that follow at DEBUG.
                    LOG.log(failures == 0 ? Level.WARNING : Level.DEBUG, "rota registration stream lost (" + why
                            + "); reconnecting in " + delay.toMillis() + " ms");
                    failures++;
                    retry = scheduler.schedule(this::reconnect, delay.toNanos(), TimeUnit.NANOSECONDS);
                }
            }
        }
        RotaException failure = new RotaException(Status.Code.UNAVAILABLE,
                "registration stream lost: " + (closingReason != null ? closingReason : RotaException.describe(status)));
        for (CompletableFuture<Ack> orphan : orphans) {
            orphan.completeExceptionally(failure);
        }
        if (wasCurrent && !firstAck.isDone() && !retryable(status.getCode())) {
            firstAck.completeExceptionally(new RotaException(status.getCode(), status.getDescription(), status.getCause()));
        }
    }

    /** {@code CODE: description}, with the transport's reason when there is one. */
    private static String describeFailure(Status status) {
        String why = RotaException.transportCause(status.getCause());
        String text = status.getCode() + (status.getDescription() != null ? ": " + status.getDescription() : "");
        return why == null ? text : why + " (" + text + ")";
    }

    /** Why the last stream was lost, or null when none was. */
    String lastStreamFailure() {
        synchronized (lock) {
            return lastFailure;
        }
    }

    private void reconnect() {
        synchronized (lock) {
            if (closed || current != null) {
                return;
            }
            reconnects++;
            beforeReconnect.run();
            connect();
        }
    }

    private static boolean retryable(Status.Code code) {
        return switch (code) {
            case UNIMPLEMENTED, INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION -> false;
            default -> true;
        };
    }

    private void onAck(Stream stream, Ack ack) {
        synchronized (lock) {
            if (stream != current) {
                return;
            }
            failures = 0;
            stream.leaseId = ack.leaseId();
            stream.acked = true;
            long interval = Math.max(1, ack.heartbeatTimeout().toMillis() / HEARTBEATS_PER_TIMEOUT);
            if (heartbeat == null || interval != heartbeatIntervalMs) {
                if (heartbeat != null) {
                    heartbeat.cancel(false);
                }
                heartbeatIntervalMs = interval;
                heartbeat = scheduler.scheduleAtFixedRate(() -> beat(stream), interval, interval, TimeUnit.MILLISECONDS);
            }
        }
    }

    private void beat(Stream stream) {
        synchronized (lock) {
            if (stream != current || closed) {
                return;
            }
            if (!unconfirmed.isEmpty()) {
                // Announcing counts as a heartbeat too.
                List<Instance> retrying = List.copyOf(unconfirmed.values());
                stream.send(announcement(retrying), ack -> remember(retrying, ack, true));
            } else {
                stream.send(RegisterRequest.newBuilder().setHeartbeat(Heartbeat.getDefaultInstance()).build(), null);
            }
            heartbeatsSent++;
        }
    }

    private void cancelTimers() {
        if (heartbeat != null) {
            heartbeat.cancel(false);
            heartbeat = null;
        }
        if (retry != null) {
            retry.cancel(false);
            retry = null;
        }
    }

    private CompletableFuture<Ack> send(RegisterRequest request, Consumer<Ack> onAck) {
        synchronized (lock) {
            if (closed) {
                return CompletableFuture.failedFuture(new RotaException(Status.Code.FAILED_PRECONDITION, "registration closed"));
            }
            if (current == null) {
                return CompletableFuture.failedFuture(
                        new RotaException(Status.Code.UNAVAILABLE, "registration stream is reconnecting"));
            }
            return current.send(request, onAck);
        }
    }

    private Ack await(CompletableFuture<Ack> future) {
        try {
            return future.get(ackTimeout.toNanos(), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RotaException(Status.Code.CANCELLED, "interrupted waiting for an ack", e);
        } catch (ExecutionException e) {
            throw RotaException.from(e.getCause());
        } catch (TimeoutException e) {
            throw new RotaException(Status.Code.DEADLINE_EXCEEDED, "no ack within " + ackTimeout.toMillis() + " ms");
        }
    }

    // --- bookkeeping of what is registered (all under the lock) --------------------------------

    private static String key(String service, String id) {
        return service + "/" + id;
    }

    private void remember(List<Instance> announced, Ack ack, boolean again) {
        Map<String, Instance> byKey = new LinkedHashMap<>();
        for (Instance instance : announced) {
            // With the id the server gives an instance announced without one.
            InstanceRef ref = instance.ref();
            byKey.put(key(ref.service(), ref.id()), instance.withId(ref.id()));
        }
        synchronized (lock) {
            for (InstanceRef ref : ack.accepted()) {
                String key = key(ref.service(), ref.id());
                Instance instance = byKey.get(key);
                if (instance != null) {
                    instances.put(key, instance);
                    unconfirmed.remove(key);
                }
            }
            if (!again) {
                return;
            }
            for (Refusal refusal : ack.refused()) {
                String key = key(refusal.instance().service(), refusal.instance().id());
                Instance instance = instances.remove(key);
                if (instance == null) {
                    instance = unconfirmed.remove(key);
                }
                if (instance == null) {
                    continue;
                }
                if (refusal.code() == Status.Code.ALREADY_EXISTS) {
                    // Most likely still held by the lease of the stream that was lost: retry.
                    unconfirmed.put(key, instance);
                } else {
                    LOG.log(Level.WARNING, "rota refused to register " + key + " again: " + refusal.message());
                }
            }
        }
    }

    private void applyUpdate(Update update, Ack ack) {
        InstanceRef ref = update.instance();
        synchronized (lock) {
            if (!ack.accepted().contains(ref)) {
                return;
            }
            String key = key(ref.service(), ref.id());
            Instance instance = instances.get(key);
            if (instance == null) {
                return;
            }
            instances.put(key, update.applyTo(instance));
        }
    }

    private void forget(List<InstanceRef> refs, Ack ack) {
        synchronized (lock) {
            if (refs.isEmpty()) {
                instances.clear();
                unconfirmed.clear();
                return;
            }
            for (InstanceRef ref : ack.accepted()) {
                instances.remove(key(ref.service(), ref.id()));
            }
            // rota holds no unconfirmed instance on this stream (so it refuses to withdraw one);
            // it is no longer wanted all the same.
            for (InstanceRef ref : refs) {
                unconfirmed.remove(key(ref.service(), ref.id()));
            }
        }
    }

    @Override
    public String toString() {
        synchronized (lock) {
            return "Registration{instances=" + instances.keySet() + ", connected=" + (current != null)
                    + ", closed=" + closed + "}";
        }
    }

    /** One {@code Register} stream; acknowledgements answer its messages in order. */
    private final class Stream implements ClientResponseObserver<RegisterRequest, RegisterResponse> {
        private ClientCallStreamObserver<RegisterRequest> requests;
        private final Deque<Pending> pending = new ArrayDeque<>();
        private long leaseId;
        private boolean acked;
        private String closingReason;
        private boolean finished;

        @Override
        public void beforeStart(ClientCallStreamObserver<RegisterRequest> requestStream) {
            this.requests = requestStream;
        }

        /** Sends one message; heartbeats ({@code onAck == null}) get no acknowledgement. Holds the lock. */
        CompletableFuture<Ack> send(RegisterRequest request, Consumer<Ack> onAck) {
            CompletableFuture<Ack> future = new CompletableFuture<>();
            if (finished) {
                future.completeExceptionally(new RotaException(Status.Code.UNAVAILABLE, "registration stream ended"));
                return future;
            }
            if (onAck != null) {
                pending.add(new Pending(future, onAck));
            } else {
                future.complete(null);
            }
            requests.onNext(request);
            return future;
        }

        void cancel() {
            finished = true;
            requests.cancel("registration closed", null);
        }

        /** Half-closes the stream. Holds the lock or is no longer current. */
        void finish() {
            synchronized (lock) {
                if (!finished) {
                    finished = true;
                    requests.onCompleted();
                }
            }
        }

        List<CompletableFuture<Ack>> drain() {
            finished = true;
            List<CompletableFuture<Ack>> futures = new ArrayList<>();
            for (Pending p : pending) {
                futures.add(p.future);
            }
            pending.clear();
            return futures;
        }

        @Override
        public void onNext(RegisterResponse response) {
            switch (response.getMsgCase()) {
                case ACK -> {
                    Ack ack = Wire.ack(response.getAck());
                    Pending head;
                    synchronized (lock) {
                        head = pending.poll();
                    }
                    onAck(this, ack);
                    if (head != null) {
                        head.onAck.accept(ack);
                        head.future.complete(ack);
                    }
                }
                case CLOSING -> {
                    synchronized (lock) {
                        closingReason = response.getClosing().getReason();
                    }
                }
                case MSG_NOT_SET -> {
                }
            }
        }

        @Override
        public void onError(Throwable t) {
            streamEnded(this, Status.fromThrowable(t), closingReason());
        }

        @Override
        public void onCompleted() {
            String reason = closingReason();
            streamEnded(this, Status.UNAVAILABLE.withDescription("the server ended the stream"),
                    reason);
        }

        private String closingReason() {
            synchronized (lock) {
                return closingReason;
            }
        }
    }

    private record Pending(CompletableFuture<Ack> future, Consumer<Ack> onAck) {
    }
}
