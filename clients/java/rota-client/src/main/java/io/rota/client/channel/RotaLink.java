package io.rota.client.channel;

import java.lang.System.Logger.Level;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import com.google.common.util.concurrent.FutureCallback;
import com.google.common.util.concurrent.Futures;
import com.google.common.util.concurrent.MoreExecutors;

import io.grpc.Attributes;
import io.grpc.ClientInterceptor;
import io.grpc.ConnectivityState;
import io.grpc.Context;
import io.grpc.Grpc;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.rota.client.RotaCredentials;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.CallOutcome;
import io.rota.v1.CallResult;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.ReportRequest;

/**
 * The resolver's connection to rota, shared with the channel's load balancer through the
 * resolution attributes: leases, batched outcome reports, and a scheduler for both.
 */
final class RotaLink implements AutoCloseable {
    private static final System.Logger LOG = System.getLogger(RotaLink.class.getName());
    static final Attributes.Key<RotaLink> KEY = Attributes.Key.create("io.rota.client.channel.link");
    private static final Metadata.Key<String> ROTA_ERROR = Metadata.Key.of("rota-error", Metadata.ASCII_STRING_MARSHALLER);
    private static final AtomicInteger THREADS = new AtomicInteger();
    /** The server takes at most this many outcomes per Report. */
    static final int REPORT_BATCH = 1000;
    /** Outcomes kept while rota is unreachable; older ones are dropped past it. */
    static final int REPORT_BACKLOG = 20_000;
    static final long REPORT_INTERVAL_MS = 100;
    private static final long LEASE_DEADLINE_MS = 2000;
    /** Lease calls made by every channel of this process (read by the benchmark). */
    static final java.util.concurrent.atomic.AtomicLong LEASE_CALLS = new java.util.concurrent.atomic.AtomicLong();

    final String server;
    final String service;
    private final ManagedChannel channel;
    private final BalancerGrpc.BalancerFutureStub balancer;
    final RegistryGrpc.RegistryStub registry;
    final ScheduledThreadPoolExecutor scheduler;
    /** Outcomes not yet sent, oldest first; guarded by itself (held only to add or take). */
    private final ArrayDeque<Outcome> pending = new ArrayDeque<>();
    private long dropped;
    private boolean dropping;
    private final AtomicBoolean reporting = new AtomicBoolean();
    private final AtomicBoolean flushQueued = new AtomicBoolean();

    /** One RPC's outcome, kept small until it is sent. */
    record Outcome(String instance, long ticket, String rule, long latencyUs, CallResult result) {
    }

    RotaLink(String server, String service) {
        this(server, service, RotaCredentials.none(), REPORT_INTERVAL_MS);
    }

    RotaLink(String server, String service, RotaCredentials credentials) {
        this(server, service, credentials, REPORT_INTERVAL_MS);
    }

    RotaLink(String server, String service, long reportIntervalMs, ClientInterceptor... interceptors) {
        this(server, service, RotaCredentials.none(), reportIntervalMs, interceptors);
    }

    /**
     * A link to rota at {@code server} ({@code host:port}, {@code https://host:port} for TLS, or a
     * gRPC target with a scheme of its own) with {@code credentials} as they are: the caller has
     * already taken what it leaves out from the environment.
     */
    RotaLink(String server, String service, RotaCredentials credentials, long reportIntervalMs,
            ClientInterceptor... interceptors) {
        this.server = server;
        this.service = service;
        // An explicit scheme: rota's own address never goes through a rota resolver.
        // Never idle: a connection to rota that stops being READY means rota went away (watchConnection).
        String address = RotaCredentials.address(server);
        this.channel = Grpc.newChannelBuilder(address.contains("://") ? address : "dns:///" + address,
                credentials.channelCredentials(server)).idleTimeout(30, TimeUnit.DAYS).build();
        this.balancer = BalancerGrpc.newFutureStub(channel).withInterceptors(interceptors);
        this.registry = RegistryGrpc.newStub(channel);
        this.scheduler = new ScheduledThreadPoolExecutor(1, task -> {
            Thread thread = new Thread(task, "rota-channel-" + THREADS.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        });
        scheduler.setRemoveOnCancelPolicy(true);
        scheduler.scheduleWithFixedDelay(this::flush, reportIntervalMs, reportIntervalMs, TimeUnit.MILLISECONDS);
    }

    /**
     * Reserves {@code count} tickets mapped over the eligible instances but those of
     * {@code exclude}; never runs on the caller's RPC context (its deadline or cancellation).
     */
    CompletableFuture<LeaseResponse> lease(String rule, String version, int count, List<String> exclude) {
        LeaseRequest request = LeaseRequest.newBuilder().setService(service).setRule(rule).setVersion(version)
                .setCount(count).addAllExclude(exclude).build();
        CompletableFuture<LeaseResponse> result = new CompletableFuture<>();
        LEASE_CALLS.incrementAndGet();
        Context.ROOT.run(() -> Futures.addCallback(
                balancer.withDeadlineAfter(LEASE_DEADLINE_MS, TimeUnit.MILLISECONDS).lease(request),
                new FutureCallback<LeaseResponse>() {
                    @Override
                    public void onSuccess(LeaseResponse response) {
                        result.complete(response);
                    }

                    @Override
                    public void onFailure(Throwable t) {
                        result.completeExceptionally(t);
                    }
                }, MoreExecutors.directExecutor()));
        return result;
    }

    private volatile Runnable onWatchLost = () -> { };

    /** What to do when the resolver's watch of the service breaks (the balancer's rotations go local). */
    void onWatchLost(Runnable action) {
        onWatchLost = action;
    }

    void watchLost() {
        onWatchLost.run();
    }

    /**
     * Runs {@code lost} each time the connection to rota, once READY, stops being READY (rota
     * stopped or restarted: its tickets held here may be of a counter rota no longer has). For a
     * balancer with no watch of its own to tell it (rota's xDS policy).
     */
    void watchConnection(Runnable lost) {
        follow(channel.getState(true), lost);
    }

    private void follow(ConnectivityState seen, Runnable lost) {
        channel.notifyWhenStateChanged(seen, () -> {
            ConnectivityState now = channel.getState(false);
            if (now == ConnectivityState.SHUTDOWN) {
                return;
            }
            if (seen == ConnectivityState.READY && now != ConnectivityState.READY) {
                lost.run();
            }
            follow(now, lost);
        });
    }

    /** Reconnects to rota now rather than after the channel's backoff (rota may be back). */
    void resetConnectBackoff() {
        channel.resetConnectBackoff();
    }

    /** True when rota itself answered (its {@code rota-error} trailer), false for a transport failure. */
    static boolean answeredByRota(Throwable t) {
        Metadata trailers = Status.trailersFromThrowable(t);
        return trailers != null && trailers.containsKey(ROTA_ERROR);
    }

    /**
     * Queues an RPC's outcome, off the RPC's path: outcomes go to rota in Reports of at most
     * {@value #REPORT_BATCH}, every {@value #REPORT_INTERVAL_MS} ms or as soon as a full batch
     * waits. While rota is away at most {@value #REPORT_BACKLOG} wait; past that the oldest are
     * dropped and counted.
     */
    void report(Outcome outcome) {
        boolean full;
        synchronized (pending) {
            if (pending.size() >= REPORT_BACKLOG) {
                pending.pollFirst();
                drop(1);
            }
            pending.addLast(outcome);
            // Exactly at a full batch: while rota is away the queue stays above it, and flushing
            // on every RPC would retry a failing Report in a loop.
            full = pending.size() == REPORT_BATCH;
        }
        if (full) {
            flushSoon();
        }
    }

    /** Outcomes dropped for lack of room since the channel started. */
    long droppedOutcomes() {
        synchronized (pending) {
            return dropped;
        }
    }

    /** Counts dropped outcomes; logs once per outage. Holds {@code pending}. */
    private void drop(int n) {
        dropped += n;
        if (!dropping) {
            dropping = true;
            LOG.log(Level.WARNING, () -> "rota: call outcomes of \"" + service + "\" not reported in time; dropping the oldest beyond "
                    + REPORT_BACKLOG);
        }
    }

    private void flushSoon() {
        if (!reporting.get() && flushQueued.compareAndSet(false, true)) {
            try {
                scheduler.execute(() -> {
                    flushQueued.set(false);
                    flush();
                });
            } catch (java.util.concurrent.RejectedExecutionException closed) {
                flushQueued.set(false);
            }
        }
    }

    private void flush() {
        if (!reporting.compareAndSet(false, true)) {
            return;
        }
        List<Outcome> batch = new ArrayList<>();
        synchronized (pending) {
            Outcome outcome;
            while (batch.size() < REPORT_BATCH && (outcome = pending.pollFirst()) != null) {
                batch.add(outcome);
            }
        }
        if (batch.isEmpty()) {
            reporting.set(false);
            return;
        }
        ReportRequest.Builder request = ReportRequest.newBuilder();
        for (Outcome o : batch) {
            request.addOutcomes(CallOutcome.newBuilder().setService(service).setInstanceId(o.instance())
                    .setTicket(o.ticket()).setRule(o.rule()).setLatencyUs(o.latencyUs()).setResult(o.result())
                    .setLeased(true));
        }
        Futures.addCallback(
                balancer.withDeadlineAfter(LEASE_DEADLINE_MS, TimeUnit.MILLISECONDS).report(request.build()),
                new FutureCallback<>() {
                    @Override
                    public void onSuccess(io.rota.v1.ReportResponse response) {
                        boolean more;
                        synchronized (pending) {
                            dropping = false;
                            more = pending.size() >= REPORT_BATCH;
                        }
                        reporting.set(false);
                        if (more) {
                            flushSoon();
                        }
                    }

                    @Override
                    public void onFailure(Throwable t) {
                        LOG.log(Level.DEBUG, () -> batch.size() + " outcomes not reported yet: " + Status.fromThrowable(t));
                        synchronized (pending) {
                            for (int i = batch.size() - 1; i >= 0; i--) {
                                pending.addFirst(batch.get(i));
                            }
                            int excess = pending.size() - REPORT_BACKLOG;
                            for (int i = 0; i < excess; i++) {
                                pending.pollFirst();
                            }
                            if (excess > 0) {
                                drop(excess);
                            }
                        }
                        reporting.set(false);
                    }
                }, MoreExecutors.directExecutor());
    }

    @Override
    public void close() {
        flush();
        scheduler.shutdownNow();
        channel.shutdown();
    }
}
