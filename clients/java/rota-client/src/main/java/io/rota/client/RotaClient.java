package io.rota.client;

import java.lang.System.Logger.Level;
import java.net.ConnectException;
import java.net.NoRouteToHostException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

import com.google.common.util.concurrent.FutureCallback;
import com.google.common.util.concurrent.Futures;
import com.google.common.util.concurrent.ListenableFuture;
import com.google.common.util.concurrent.MoreExecutors;

import io.grpc.Channel;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.ListInstancesRequest;
import io.rota.v1.ListServicesRequest;
import io.rota.v1.PickRequest;
import io.rota.v1.PickResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.ReportRequest;
import io.rota.v1.ReportResponse;

/**
 * A client of one rota server: picks, outcome reports, registrations and listings.
 *
 * <pre>{@code
 * try (RotaClient rota = RotaClient.builder().target("127.0.0.1:50051").follow("orders").build()) {
 *     Pick pick = rota.pick("orders", PickOptions.rule("round_robin"));
 *     String body = rota.timed(pick, () -> http.get(pick.authority()));
 * }
 * }</pre>
 *
 * <p>Everything it takes and returns is this package's own immutable model ({@link Instance},
 * {@link Pick}, {@link Ack}, ...); the generated wire messages stay inside the client.
 *
 * <p><b>Versions.</b> A pick with no explicit version asks for {@link RotaVersion#current()}.
 *
 * <p><b>Local fallback.</b> For each followed service ({@link Builder#follow}, {@link #follow})
 * the client keeps the instance list last seen through {@code Watch}. When a pick fails because
 * rota cannot be reached ({@link RotaException#isUnreachable()}: a transport failure or an expired
 * deadline) or is still {@code warming_up} after a restart ({@link RotaException#fallsBack()}),
 * the client picks from that list as
 * rota would by round robin (version isolation, then exclusions; tickets 0, 1, 2, ... per
 * service and version subset) and returns a {@link Pick} with {@code localFallback() == true}.
 * The first local pick of an outage is logged at WARNING, the recovery at INFO. After
 * {@value #UNREACHABLE_STREAK} unreachable picks in a row, picks go straight to the fallback for
 * {@link #SHORT_CUT} ({@link Builder#shortCut}) before rota is asked again, so a hung rota does
 * not cost a deadline per pick; an answer of rota's, or a watch snapshot, ends that at once.
 *
 * <p><b>Connection.</b> Every pick is bounded by the pick timeout (2 s by default); the channel
 * the client makes sends HTTP/2 keepalive pings ({@link #KEEPALIVE_TIME}, answered within
 * {@link #KEEPALIVE_TIMEOUT}) so a dead rota is noticed without a call, and reconnects within the
 * client's {@link Backoff} rather than grpc-java's (up to 120 s).
 *
 * <p>Thread-safe; share one client. {@link #close()} withdraws open registrations, stops the
 * watchers and shuts the channel down.
 */
public final class RotaClient implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(RotaClient.class.getName());

    /** Where {@code rota serve} listens by default. */
    public static final String DEFAULT_TARGET = "127.0.0.1:50051";
    /** Most outcomes the server takes in one {@code Report} request. */
    public static final int MAX_OUTCOMES_PER_REPORT = 1000;

    /** Unreachable picks in a row after which picks short-cut to the local fallback. */
    public static final int UNREACHABLE_STREAK = 3;
    /** How long picks short-cut to the local fallback before rota is asked again, by default. */
    public static final Duration SHORT_CUT = Duration.ofSeconds(1);
    /** Idle time after which the client's channel pings rota. */
    public static final Duration KEEPALIVE_TIME = Duration.ofSeconds(20);
    /** How long a keepalive ping may go unanswered before the connection counts as dead. */
    public static final Duration KEEPALIVE_TIMEOUT = Duration.ofSeconds(5);

    private static final AtomicInteger THREADS = new AtomicInteger();

    private final Channel channel;
    /** rota's address as errors name it: the target, or the given channel's authority. */
    private final String server;
    private final ManagedChannel ownedChannel;
    private final ManagedChannel managedChannel;
    private final BalancerGrpc.BalancerBlockingStub balancer;
    private final BalancerGrpc.BalancerFutureStub balancerAsync;
    private final RegistryGrpc.RegistryBlockingStub registry;
    private final RegistryGrpc.RegistryStub registryAsync;
    private final ScheduledThreadPoolExecutor scheduler;
    private final Duration pickTimeout;
    private final Duration shortCut;
    private final Duration callTimeout;
    private final Duration registerTimeout;
    private final Duration withdrawTimeout;
    private final Backoff backoff;
    private final ConcurrentHashMap<String, ServiceWatcher> watchers = new ConcurrentHashMap<>();
    private final Set<Registration> registrations = ConcurrentHashMap.newKeySet();
    private final LocalBalancer local = new LocalBalancer();
    private final ReconnectBound reconnectBound;
    private final Object health = new Object();
    /** Unreachable picks in a row (guarded by {@link #health}). */
    private int unreachableStreak;
    /** {@link System#nanoTime()} until which picks short-cut to the fallback (guarded by {@link #health}). */
    private long shortCutUntil;
    private boolean shortCutting;
    /** Whether this outage was logged (its first local pick); guarded by {@link #health}. */
    private boolean outageLogged;
    private volatile boolean closed;

    private RotaClient(Builder builder) {
        Channel base;
        if (builder.channel != null) {
            base = builder.channel;
            ownedChannel = null;
        } else {
            RotaCredentials credentials = builder.credentials.resolveFor(builder.target, builder.environment);
            ownedChannel = Grpc.newChannelBuilder(normalizeTarget(builder.target), credentials.channelCredentials(builder.target))
                    .keepAliveTime(KEEPALIVE_TIME.toNanos(), TimeUnit.NANOSECONDS)
                    .keepAliveTimeout(KEEPALIVE_TIMEOUT.toNanos(), TimeUnit.NANOSECONDS)
                    // Watch streams are calls too; without them there is nothing to keep alive.
                    .keepAliveWithoutCalls(false)
                    .build();
            base = ownedChannel;
        }
        server = builder.channel != null ? base.authority() : normalizeTarget(builder.target);
        managedChannel = base instanceof ManagedChannel m ? m : null;
        channel = ClientInterceptors.intercept(base, builder.interceptors);
        pickTimeout = builder.pickTimeout;
        shortCut = builder.shortCut;
        callTimeout = builder.callTimeout;
        registerTimeout = builder.registerTimeout;
        withdrawTimeout = builder.withdrawTimeout;
        backoff = builder.backoff;
        balancer = BalancerGrpc.newBlockingStub(channel);
        balancerAsync = BalancerGrpc.newFutureStub(channel);
        registry = RegistryGrpc.newBlockingStub(channel);
        registryAsync = RegistryGrpc.newStub(channel);
        scheduler = new ScheduledThreadPoolExecutor(1, task -> {
            Thread thread = new Thread(task, "rota-client-" + THREADS.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        });
        scheduler.setRemoveOnCancelPolicy(true);
        if (ownedChannel != null) {
            reconnectBound = new ReconnectBound(ownedChannel, scheduler, backoff);
            reconnectBound.start();
        } else {
            reconnectBound = null;
        }
        for (String service : builder.follow) {
            follow(service);
        }
    }

    public static Builder builder() {
        return new Builder();
    }

    /**
     * The channel to rota (with the builder's interceptors), for calls this client does not
     * wrap, e.g. {@code PickStream} through the stubs generated from {@code rota/v1/rota.proto}.
     */
    public Channel channel() {
        return channel;
    }

    // --- picks ---------------------------------------------------------------------------------

    /** Picks an instance of {@code service} by round robin, for the current version. */
    public Pick pick(String service) {
        return pick(service, PickOptions.defaults());
    }

    /**
     * Picks an instance of {@code service}; a version the options leave unset is
     * {@link RotaVersion#current()}.
     *
     * @throws RotaException with the status the server answered, or {@code UNAVAILABLE} when rota
     *                       cannot be reached and no local fallback applies
     */
    public Pick pick(String service, PickOptions options) {
        return send(options.toRequest(service));
    }

    private Pick send(PickRequest effective) {
        checkOpen();
        if (shortCut()) {
            return local(effective, shortCutFailure());
        }
        try {
            PickResponse response = balancer.withDeadlineAfter(pickTimeout.toNanos(), TimeUnit.NANOSECONDS)
                    .pick(effective);
            return answered(response);
        } catch (StatusRuntimeException e) {
            return recover(effective, failure(e));
        }
    }

    /** {@link #pick(String, PickOptions)} without blocking; fails with a {@link RotaException}. */
    public CompletableFuture<Pick> pickAsync(String service, PickOptions options) {
        return sendAsync(options.toRequest(service));
    }

    private CompletableFuture<Pick> sendAsync(PickRequest effective) {
        checkOpen();
        if (shortCut()) {
            try {
                return CompletableFuture.completedFuture(local(effective, shortCutFailure()));
            } catch (RotaException e) {
                return CompletableFuture.failedFuture(e);
            }
        }
        CompletableFuture<PickResponse> call = completable(
                balancerAsync.withDeadlineAfter(pickTimeout.toNanos(), TimeUnit.NANOSECONDS).pick(effective));
        return call.handle((response, error) -> {
            if (error == null) {
                return answered(response);
            }
            return recover(effective, failure(unwrap(error)));
        });
    }

    private Pick answered(PickResponse response) {
        rotaAnswered();
        return Wire.pick(response);
    }

    /**
     * rota answered a pick (with an instance or a refusal of its own) or sent a watch snapshot:
     * the outage, if any, is over, and the next pick asks rota.
     */
    private void rotaAnswered() {
        boolean recovered;
        synchronized (health) {
            unreachableStreak = 0;
            shortCutting = false;
            recovered = outageLogged;
            outageLogged = false;
        }
        if (recovered) {
            LOG.log(Level.INFO, "rota reachable again; picks come from rota");
        }
    }

    private Pick recover(PickRequest request, RotaException failure) {
        if (!failure.fallsBack()) {
            rotaAnswered();
            throw failure;
        }
        synchronized (health) {
            unreachableStreak++;
            if (unreachableStreak >= UNREACHABLE_STREAK) {
                shortCutting = true;
                shortCutUntil = System.nanoTime() + shortCut.toNanos();
            }
        }
        return local(request, failure);
    }

    /**
     * Whether this pick goes straight to the local fallback. Past the short-cut window the next
     * pick asks rota again; the channel is told to reconnect now so that the attempt is real.
     */
    private boolean shortCut() {
        synchronized (health) {
            if (!shortCutting) {
                return false;
            }
            if (System.nanoTime() - shortCutUntil < 0) {
                return true;
            }
            shortCutting = false;
        }
        resetConnectBackoff();
        return false;
    }

    private RotaException shortCutFailure() {
        return new RotaException(Status.Code.UNAVAILABLE, "rota at " + server + " unreachable (" + UNREACHABLE_STREAK
                + " picks in a row failed); not asked again for " + shortCut.toMillis() + " ms");
    }

    /**
     * Picks from the last watched list of the service, or throws {@code failure} when the service
     * is not followed or its list was never seen.
     */
    private Pick local(PickRequest request, RotaException failure) {
        ServiceWatcher watcher = watchers.get(request.getService());
        ServiceWatcher.Snapshot last = watcher == null ? null : watcher.snapshot();
        if (last == null || !last.synced()) {
            throw failure;
        }
        Pick pick = local.pick(request, last.instances(), last.epoch());
        boolean first;
        synchronized (health) {
            first = !outageLogged;
            outageLogged = true;
        }
        if (first) {
            LOG.log(Level.WARNING, "rota unreachable (" + failure.getMessage() + "); picking locally from the last "
                    + "watched instance lists until it answers again (first: " + request.getService() + " -> "
                    + pick.id() + " at " + pick.authority() + ")");
        }
        return pick;
    }

    // --- local fallback --------------------------------------------------------------------------

    /**
     * Starts following {@code service} through {@code Watch} in the background (idempotent), so
     * that picks of it survive rota being unreachable.
     */
    public void follow(String service) {
        Objects.requireNonNull(service, "service");
        checkOpen();
        watchers.computeIfAbsent(service, name -> {
            ServiceWatcher watcher = new ServiceWatcher(name, registryAsync, scheduler, backoff,
                    this::resetConnectBackoff, this::rotaAnswered);
            watcher.start();
            return watcher;
        });
    }

    /** The watcher of a followed service, or {@code null}. */
    ServiceWatcher watcher(String service) {
        return watchers.get(service);
    }

    /** Stops following {@code service} and forgets its instance list. */
    public void unfollow(String service) {
        ServiceWatcher watcher = watchers.remove(service);
        if (watcher != null) {
            watcher.close();
        }
    }

    /** The services followed. */
    public Set<String> followed() {
        return Set.copyOf(watchers.keySet());
    }

    /**
     * The instance list of a followed service as last seen through {@code Watch}, ordered by id
     * (empty when not followed or not seen yet).
     */
    public List<Instance> lastKnownInstances(String service) {
        ServiceWatcher watcher = watchers.get(service);
        return watcher == null ? List.of() : watcher.snapshot().instances();
    }

    // --- reports -------------------------------------------------------------------------------

    public ReportResult report(CallOutcome... outcomes) {
        return report(List.of(outcomes));
    }

    /** Reports call outcomes (in requests of at most {@value #MAX_OUTCOMES_PER_REPORT}). */
    public ReportResult report(Collection<CallOutcome> outcomes) {
        checkOpen();
        int accepted = 0;
        int ignored = 0;
        for (List<io.rota.v1.CallOutcome> batch : batches(outcomes)) {
            try {
                ReportResponse response = balancer.withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                        .report(ReportRequest.newBuilder().addAllOutcomes(batch).build());
                accepted += response.getAccepted();
                ignored += response.getIgnored();
            } catch (StatusRuntimeException e) {
                throw failure(e);
            }
        }
        return new ReportResult(accepted, ignored);
    }

    /** Reports the outcome of one call to a picked instance. */
    public ReportResult report(Pick pick, CallResult result, Duration latency) {
        return report(pick.outcome(result, latency));
    }

    /** {@link #report(Collection)} without blocking; fails with a {@link RotaException}. */
    public CompletableFuture<ReportResult> reportAsync(Collection<CallOutcome> outcomes) {
        checkOpen();
        List<CompletableFuture<ReportResponse>> calls = new ArrayList<>();
        for (List<io.rota.v1.CallOutcome> batch : batches(outcomes)) {
            calls.add(completable(balancerAsync.withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                    .report(ReportRequest.newBuilder().addAllOutcomes(batch).build())));
        }
        return CompletableFuture.allOf(calls.toArray(CompletableFuture[]::new)).handle((ignoredResult, error) -> {
            if (error != null) {
                throw failure(unwrap(error));
            }
            int accepted = 0;
            int ignored = 0;
            for (CompletableFuture<ReportResponse> call : calls) {
                ReportResponse response = call.join();
                accepted += response.getAccepted();
                ignored += response.getIgnored();
            }
            return new ReportResult(accepted, ignored);
        });
    }

    /**
     * Runs {@code call} against the picked instance, reports its outcome ({@code OK}, or
     * {@code CONNECT_FAILURE}/{@code ERROR} when it throws) with its latency in the background,
     * and returns its result or rethrows its exception. Picks made locally are not reported.
     */
    public <T> T timed(Pick pick, Callable<T> call) throws Exception {
        long start = System.nanoTime();
        try {
            T result = call.call();
            reportInBackground(pick, CallResult.OK, Duration.ofNanos(System.nanoTime() - start));
            return result;
        } catch (Throwable t) {
            reportInBackground(pick, classify(t), Duration.ofNanos(System.nanoTime() - start));
            throw t;
        }
    }

    /**
     * The result to report for a call that threw {@code failure}: {@code CONNECT_FAILURE} when its
     * cause chain shows the instance could not be reached, else {@code ERROR}.
     */
    public static CallResult classify(Throwable failure) {
        Throwable t = failure;
        for (int depth = 0; t != null && depth < 32; depth++, t = t.getCause()) {
            if (t instanceof ConnectException || t instanceof NoRouteToHostException
                    || t.getClass().getName().equals("java.net.http.HttpConnectTimeoutException")) {
                return CallResult.CONNECT_FAILURE;
            }
        }
        return CallResult.ERROR;
    }

    private void reportInBackground(Pick pick, CallResult result, Duration latency) {
        if (pick.localFallback() || closed) {
            return;
        }
        reportAsync(List.of(pick.outcome(result, latency))).whenComplete((r, error) -> {
            if (error != null) {
                LOG.log(Level.DEBUG, () -> "outcome of a call to " + pick.id() + " not reported: " + unwrap(error));
            }
        });
    }

    private static List<List<io.rota.v1.CallOutcome>> batches(Collection<CallOutcome> outcomes) {
        List<io.rota.v1.CallOutcome> all = outcomes.stream().map(Wire::outcome).toList();
        List<List<io.rota.v1.CallOutcome>> batches = new ArrayList<>();
        for (int from = 0; from < all.size(); from += MAX_OUTCOMES_PER_REPORT) {
            batches.add(all.subList(from, Math.min(all.size(), from + MAX_OUTCOMES_PER_REPORT)));
        }
        if (batches.isEmpty()) {
            batches.add(List.of());
        }
        return batches;
    }

    // --- registry ------------------------------------------------------------------------------

    public Registration register(Instance... instances) {
        return register(List.of(instances));
    }

    /**
     * Registers {@code instances} and waits for the server's acknowledgement (reconnecting with
     * backoff if rota cannot be reached yet, up to the register timeout). All or nothing: when rota
     * refuses any of them, the accepted ones are withdrawn again and a
     * {@link RegistrationRefusedException} (with the ack) is thrown; see
     * {@link #registerAllowingPartial} to keep what was accepted.
     *
     * @throws RegistrationRefusedException when rota refused one of the instances
     * @throws RotaException                when no acknowledgement came in time or the server refused the stream
     */
    public Registration register(Collection<Instance> instances) {
        Registration registration = awaitFirstAck(registerAsync(instances));
        Ack ack = registration.ack();
        if (!ack.refused().isEmpty()) {
            registration.close();
            throw new RegistrationRefusedException(ack);
        }
        return registration;
    }

    public Registration registerAllowingPartial(Instance... instances) {
        return registerAllowingPartial(List.of(instances));
    }

    /**
     * Like {@link #register(Collection)}, but instances rota refuses are only listed in
     * {@link Registration#ack()} ({@code refused}); the accepted ones stay registered.
     *
     * @throws RotaException when no acknowledgement came in time or the server refused the stream
     */
    public Registration registerAllowingPartial(Collection<Instance> instances) {
        return awaitFirstAck(registerAsync(instances));
    }

    private Registration awaitFirstAck(Registration registration) {
        try {
            registration.ready().get(registerTimeout.toNanos(), TimeUnit.NANOSECONDS);
            return registration;
        } catch (InterruptedException e) {
            registration.close();
            Thread.currentThread().interrupt();
            throw new RotaException(Status.Code.CANCELLED, "interrupted while registering", e);
        } catch (ExecutionException e) {
            registration.close();
            throw failure(e.getCause());
        } catch (TimeoutException e) {
            String last = registration.lastStreamFailure();
            registration.close();
            throw new RotaException(Status.Code.DEADLINE_EXCEEDED, "no acknowledgement from rota at " + server + " within "
                    + registerTimeout.toMillis() + " ms" + (last == null ? "" : " (last attempt: " + last + ")"));
        }
    }

    /**
     * Starts registering {@code instances} and returns at once; the registration connects (and
     * reconnects) in the background. {@link Registration#ready()} completes with the first ack,
     * which lists any refused instance (the accepted ones stay registered).
     */
    public Registration registerAsync(Collection<Instance> instances) {
        checkOpen();
        Registration registration = new Registration(registryAsync, scheduler, backoff, callTimeout, withdrawTimeout,
                this::resetConnectBackoff, registrations::remove, List.copyOf(instances));
        registrations.add(registration);
        registration.start();
        return registration;
    }

    private void resetConnectBackoff() {
        // The registration has its own backoff; the channel must not add its own on top.
        if (managedChannel != null) {
            managedChannel.resetConnectBackoff();
        }
    }

    /** The services rota knows, with their instance counts. */
    public List<ServiceSummary> listServices() {
        checkOpen();
        try {
            return registry.withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                    .listServices(ListServicesRequest.getDefaultInstance()).getServicesList().stream()
                    .map(Wire::service).toList();
        } catch (StatusRuntimeException e) {
            throw failure(e);
        }
    }

    /** The instances of one service, ordered by id, with the epoch of that list. */
    public InstanceList listInstances(String service) {
        checkOpen();
        try {
            return Wire.instanceList(registry.withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                    .listInstances(ListInstancesRequest.newBuilder().setService(service).build()));
        } catch (StatusRuntimeException e) {
            throw failure(e);
        }
    }

    /**
     * Watches {@code service}: a {@link WatchEvent.Snapshot} of its instances, then an event per
     * change, delivered to {@code listener} in order until the returned {@link Watch} is closed,
     * the watch fails ({@link WatchListener#onError}) or rota ends it. One stream, not reopened.
     */
    public Watch watch(String service, WatchListener listener) {
        Objects.requireNonNull(service, "service");
        Objects.requireNonNull(listener, "listener");
        checkOpen();
        Watch watch = new Watch(service, listener, 0, this::failure);
        watch.start(registryAsync);
        return watch;
    }

    /**
     * Watches {@code service} as a blocking iterator of {@link WatchEvent}s: a snapshot first, then
     * each change, until the {@link WatchStream} is closed or rota ends it; a failure is thrown
     * from {@link WatchStream#hasNext()}.
     *
     * <pre>{@code
     * try (WatchStream events = rota.watch("orders")) {
     *     events.forEachRemaining(event -> System.out.println(event));
     * }
     * }</pre>
     */
    public WatchStream watch(String service) {
        Objects.requireNonNull(service, "service");
        checkOpen();
        WatchStream stream = new WatchStream(service, this::failure);
        stream.watch().start(registryAsync);
        return stream;
    }

    /**
     * A failed call as a {@link RotaException}; when rota could not be reached, its description
     * names rota's address and the transport's reason.
     */
    private RotaException failure(Throwable t) {
        return RotaException.from(t).at(server);
    }

    // --- lifecycle -----------------------------------------------------------------------------

    private void checkOpen() {
        if (closed) {
            throw new RotaException(Status.Code.FAILED_PRECONDITION, "client closed");
        }
    }

    /** Withdraws open registrations, stops watchers and shuts the channel down (when the client made it). */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        for (Registration registration : new ArrayList<>(registrations)) {
            registration.close();
        }
        closed = true;
        for (String service : new ArrayList<>(watchers.keySet())) {
            unfollow(service);
        }
        if (reconnectBound != null) {
            reconnectBound.close();
        }
        scheduler.shutdownNow();
        if (ownedChannel != null) {
            ownedChannel.shutdown();
            try {
                if (!ownedChannel.awaitTermination(2, TimeUnit.SECONDS)) {
                    ownedChannel.shutdownNow();
                }
            } catch (InterruptedException e) {
                ownedChannel.shutdownNow();
                Thread.currentThread().interrupt();
            }
        }
    }

    @Override
    public String toString() {
        return "RotaClient{" + channel.authority() + "}";
    }

    // --- helpers -------------------------------------------------------------------------------

    static String normalizeTarget(String target) {
        String t = RotaCredentials.address(target);
        if (t.isEmpty()) {
            throw new IllegalArgumentException("empty rota target");
        }
        return t;
    }

    private static <T> CompletableFuture<T> completable(ListenableFuture<T> future) {
        CompletableFuture<T> result = new CompletableFuture<>() {
            @Override
            public boolean cancel(boolean mayInterruptIfRunning) {
                future.cancel(mayInterruptIfRunning);
                return super.cancel(mayInterruptIfRunning);
            }
        };
        Futures.addCallback(future, new FutureCallback<T>() {
            @Override
            public void onSuccess(T value) {
                result.complete(value);
            }

            @Override
            public void onFailure(Throwable t) {
                result.completeExceptionally(t);
            }
        }, MoreExecutors.directExecutor());
        return result;
    }

    private static Throwable unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    /** Builds a {@link RotaClient}. */
    public static final class Builder {
        private String target = DEFAULT_TARGET;
        private Channel channel;
        private final List<ClientInterceptor> interceptors = new ArrayList<>();
        private Duration pickTimeout = Duration.ofSeconds(2);
        private Duration shortCut = SHORT_CUT;
        private Duration callTimeout = Duration.ofSeconds(10);
        private Duration registerTimeout = Duration.ofSeconds(10);
        private Duration withdrawTimeout = Duration.ofSeconds(2);
        private Backoff backoff = Backoff.DEFAULT;
        private final Set<String> follow = new LinkedHashSet<>();
        private RotaCredentials credentials = RotaCredentials.none();
        private java.util.function.Function<String, String> environment = System::getenv;

        private Builder() {
        }

        /**
         * {@code host:port} of the rota server ({@code http://host:port} is accepted too;
         * {@code https://host:port} is reached over TLS, see {@link #credentials}); default
         * {@value RotaClient#DEFAULT_TARGET}.
         */
        public Builder target(String target) {
            normalizeTarget(target);
            this.target = target.trim();
            this.channel = null;
            return this;
        }

        /** Uses an existing channel instead of {@link #target}; the caller keeps owning (and shuts down) it. */
        public Builder channel(Channel channel) {
            this.channel = Objects.requireNonNull(channel, "channel");
            return this;
        }

        /**
         * The token and TLS settings for {@link #target}; each one left out is taken from
         * {@code ROTA_TOKEN}, {@code ROTA_TLS_CA}, {@code ROTA_TLS_CERT} and {@code ROTA_TLS_KEY}
         * (see {@link RotaCredentials}). Not used with {@link #channel}, whose credentials are its own.
         */
        public Builder credentials(RotaCredentials credentials) {
            this.credentials = Objects.requireNonNull(credentials, "credentials");
            return this;
        }

        /** Where settings left out of {@link #credentials} are looked up; default the process environment. */
        public Builder environment(java.util.function.Function<String, String> environment) {
            this.environment = Objects.requireNonNull(environment, "environment");
            return this;
        }

        /** Interceptors for every call to rota. */
        public Builder intercept(ClientInterceptor... interceptors) {
            this.interceptors.addAll(List.of(interceptors));
            return this;
        }

        /** Deadline of one pick; past it the pick counts as rota being unreachable. Default 2 s. */
        public Builder pickTimeout(Duration timeout) {
            this.pickTimeout = positive(timeout, "pickTimeout");
            return this;
        }

        /**
         * How long picks go straight to the local fallback after {@value RotaClient#UNREACHABLE_STREAK}
         * unreachable picks in a row, before rota is asked again. Default 1 s.
         */
        public Builder shortCut(Duration window) {
            this.shortCut = positive(window, "shortCut");
            return this;
        }

        /** Deadline of reports and listings, and the wait for an ack of a registration change. Default 10 s. */
        public Builder callTimeout(Duration timeout) {
            this.callTimeout = positive(timeout, "callTimeout");
            return this;
        }

        /** How long {@link RotaClient#register} waits for the first ack. Default 10 s. */
        public Builder registerTimeout(Duration timeout) {
            this.registerTimeout = positive(timeout, "registerTimeout");
            return this;
        }

        /** How long closing a registration waits for the ack of its withdrawal. Default 2 s. */
        public Builder withdrawTimeout(Duration timeout) {
            this.withdrawTimeout = positive(timeout, "withdrawTimeout");
            return this;
        }

        /** Backoff between reconnections of registration and watch streams. Default {@link Backoff#DEFAULT}. */
        public Builder backoff(Backoff backoff) {
            this.backoff = Objects.requireNonNull(backoff, "backoff");
            return this;
        }

        /** Services to follow through {@code Watch} from the start, for the local fallback. */
        public Builder follow(String... services) {
            this.follow.addAll(List.of(services));
            return this;
        }

        public RotaClient build() {
            return new RotaClient(this);
        }

        private static Duration positive(Duration d, String name) {
            if (d == null || d.isNegative() || d.isZero()) {
                throw new IllegalArgumentException(name + " must be positive");
            }
            return d;
        }
    }
}
