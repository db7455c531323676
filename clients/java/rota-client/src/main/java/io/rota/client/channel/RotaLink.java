package io.rota.client.channel;

import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import com.google.common.util.concurrent.FutureCallback;
import com.google.common.util.concurrent.Futures;
import com.google.common.util.concurrent.MoreExecutors;

import io.grpc.Attributes;
import io.grpc.Context;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Status;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.CallOutcome;
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
    private static final int REPORT_BATCH = 1000;
    /** Outcomes kept while rota is unreachable; older ones are dropped past it. */
    private static final int REPORT_BACKLOG = 100_000;
    private static final long REPORT_INTERVAL_MS = 100;
    private static final long LEASE_DEADLINE_MS = 2000;
    /** Lease calls made by every channel of this process (read by the benchmark). */
    static final java.util.concurrent.atomic.AtomicLong LEASE_CALLS = new java.util.concurrent.atomic.AtomicLong();

    final String server;
    final String service;
    private final ManagedChannel channel;
    private final BalancerGrpc.BalancerFutureStub balancer;
    final RegistryGrpc.RegistryStub registry;
    final ScheduledThreadPoolExecutor scheduler;
    private final ConcurrentLinkedQueue<CallOutcome> outcomes = new ConcurrentLinkedQueue<>();
    private final AtomicInteger queued = new AtomicInteger();
    private volatile boolean reporting;

    RotaLink(String server, String service) {
        this.server = server;
        this.service = service;
        // An explicit scheme: rota's own address never goes through a rota resolver.
        this.channel = Grpc.newChannelBuilder(server.contains("://") ? server : "dns:///" + server,
                InsecureChannelCredentials.create()).build();
        this.balancer = BalancerGrpc.newFutureStub(channel);
        this.registry = RegistryGrpc.newStub(channel);
        this.scheduler = new ScheduledThreadPoolExecutor(1, task -> {
            Thread thread = new Thread(task, "rota-channel-" + THREADS.incrementAndGet());
            thread.setDaemon(true);
            return thread;
        });
        scheduler.setRemoveOnCancelPolicy(true);
        scheduler.scheduleWithFixedDelay(this::flush, REPORT_INTERVAL_MS, REPORT_INTERVAL_MS, TimeUnit.MILLISECONDS);
    }

    /** Reserves {@code count} tickets; never runs on the caller's RPC context (its deadline or cancellation). */
    CompletableFuture<LeaseResponse> lease(String rule, String version, int count) {
        LeaseRequest request = LeaseRequest.newBuilder().setService(service).setRule(rule).setVersion(version)
                .setCount(count).build();
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

    /** Reconnects to rota now rather than after the channel's backoff (rota may be back). */
    void resetConnectBackoff() {
        channel.resetConnectBackoff();
    }

    /** True when rota itself answered (its {@code rota-error} trailer), false for a transport failure. */
    static boolean answeredByRota(Throwable t) {
        Metadata trailers = Status.trailersFromThrowable(t);
        return trailers != null && trailers.containsKey(ROTA_ERROR);
    }

    void report(CallOutcome outcome) {
        if (queued.incrementAndGet() > REPORT_BACKLOG) {
            queued.decrementAndGet();
            return;
        }
        outcomes.add(outcome);
    }

    private void flush() {
        if (reporting || outcomes.isEmpty()) {
            return;
        }
        List<CallOutcome> batch = new ArrayList<>();
        CallOutcome outcome;
        while (batch.size() < REPORT_BATCH && (outcome = outcomes.poll()) != null) {
            batch.add(outcome);
        }
        queued.addAndGet(-batch.size());
        reporting = true;
        Futures.addCallback(
                balancer.withDeadlineAfter(LEASE_DEADLINE_MS, TimeUnit.MILLISECONDS)
                        .report(ReportRequest.newBuilder().addAllOutcomes(batch).build()),
                new FutureCallback<>() {
                    @Override
                    public void onSuccess(io.rota.v1.ReportResponse response) {
                        reporting = false;
                    }

                    @Override
                    public void onFailure(Throwable t) {
                        reporting = false;
                        LOG.log(Level.DEBUG, () -> batch.size() + " outcomes not reported: " + Status.fromThrowable(t));
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
