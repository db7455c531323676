package io.rota.client.channel;

import java.lang.System.Logger.Level;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

import io.grpc.Attributes;
import io.grpc.Context;
import io.grpc.EquivalentAddressGroup;
import io.grpc.NameResolver;
import io.grpc.Status;
import io.grpc.StatusOr;
import io.grpc.SynchronizationContext;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.client.Backoff;
import io.rota.v1.Instance;
import io.rota.client.RotaCredentials;
import io.rota.v1.InstanceStatus;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;

/**
 * Resolves {@code rota:///SERVICE} by following the service with {@code Watch}: every change of
 * its UP instances is handed to the channel, each address carrying the instance's id, version
 * and weight; the published service config selects the {@value RotaChannels#POLICY} policy.
 *
 * <p>A service with no UP instance is a resolution error (RPCs fail with {@code UNAVAILABLE}
 * naming the service, they do not hang). When the watch breaks, the last known instances stay
 * in force and the watch reconnects with backoff; after rota restarts, its registry is empty
 * until the providers announce again, so an empty first snapshot after a reconnect keeps the
 * last known instances until the watch shows one again.
 */
final class RotaNameResolver extends NameResolver {
    private static final System.Logger LOG = System.getLogger(RotaNameResolver.class.getName());
    static final Attributes.Key<String> ID = Attributes.Key.create("io.rota.client.channel.id");
    static final Attributes.Key<String> VERSION = Attributes.Key.create("io.rota.client.channel.version");
    static final Attributes.Key<Integer> WEIGHT = Attributes.Key.create("io.rota.client.channel.weight");
    private static final Backoff BACKOFF = Backoff.exponential(java.time.Duration.ofMillis(100), java.time.Duration.ofSeconds(5));

    private final String service;
    private final String server;
    private final RotaCredentials credentials;
    private final String authority;
    private final Map<String, Object> policyConfig;
    private final SynchronizationContext sync;
    private final ServiceConfigParser parser;

    // Touched only in the synchronization context.
    private Listener2 listener;
    private RotaLink link;
    private final TreeMap<String, Instance> instances = new TreeMap<>();
    private boolean synced;
    private boolean everSynced;
    private boolean holdingStale;
    private boolean published;
    private boolean shutdown;
    private int failures;
    private ClientCallStreamObserver<WatchRequest> call;
    private ScheduledFuture<?> retry;

    RotaNameResolver(String service, String server, RotaCredentials credentials, String authority,
            Map<String, Object> policyConfig, Args args) {
        this.service = service;
        this.server = server;
        this.credentials = credentials;
        this.authority = authority;
        this.policyConfig = policyConfig;
        this.sync = args.getSynchronizationContext();
        this.parser = args.getServiceConfigParser();
    }

    @Override
    public String getServiceAuthority() {
        return authority;
    }

    @Override
    public void start(Listener2 listener) {
        this.listener = listener;
        this.link = new RotaLink(server, service, credentials);
        watch();
    }

    @Override
    public void refresh() {
        // The watch pushes every change; nothing to poll.
    }

    @Override
    public void shutdown() {
        if (shutdown) {
            return;
        }
        shutdown = true;
        if (retry != null) {
            retry.cancel(false);
        }
        if (call != null) {
            call.cancel("channel shut down", null);
        }
        if (link != null) {
            link.close();
        }
    }

    private void watch() {
        if (shutdown) {
            return;
        }
        synced = false;
        Observer observer = new Observer();
        Context.ROOT.run(() -> link.registry.watch(WatchRequest.newBuilder().setService(service).build(), observer));
    }

    private void apply(WatchEvent event) {
        if (shutdown) {
            return;
        }
        switch (event.getEventCase()) {
            case SNAPSHOT -> {
                failures = 0;
                synced = true;
                if (event.getSnapshot().getInstancesCount() == 0 && everSynced && !instances.isEmpty()) {
                    holdingStale = true;
                    LOG.log(Level.INFO, "rota at " + server + " lists no instance of " + service
                            + " after a reconnect; keeping the " + instances.size() + " last known until it does");
                    return;
                }
                holdingStale = false;
                instances.clear();
                event.getSnapshot().getInstancesList().forEach(i -> instances.put(i.getId(), i));
                everSynced = true;
            }
            case ADDED, UPDATED -> {
                if (holdingStale) {
                    holdingStale = false;
                    instances.clear();
                }
                Instance i = event.hasAdded() ? event.getAdded() : event.getUpdated();
                instances.put(i.getId(), i);
            }
            case REMOVED -> {
                if (holdingStale) {
                    return;
                }
                instances.remove(event.getRemoved().getId());
            }
            case EVENT_NOT_SET -> {
                return;
            }
        }
        publish();
    }

    private void publish() {
        List<EquivalentAddressGroup> groups = new ArrayList<>();
        for (Instance i : instances.values()) {
            if (i.getStatus() != InstanceStatus.UP && i.getStatus() != InstanceStatus.INSTANCE_STATUS_UNSPECIFIED) {
                continue;
            }
            Attributes attributes = Attributes.newBuilder().set(ID, i.getId()).set(VERSION, i.getVersion())
                    .set(WEIGHT, i.hasWeight() ? i.getWeight() : 100).build();
            groups.add(new EquivalentAddressGroup(new InetSocketAddress(i.getHost(), i.getPort()), attributes));
        }
        if (groups.isEmpty()) {
            published = false;
            listener.onError(Status.UNAVAILABLE.withDescription("rota at " + server + " has no UP instance of service \""
                    + service + "\""));
            return;
        }
        published = true;
        Map<String, Object> config = new LinkedHashMap<>();
        config.put("loadBalancingConfig", List.of(Map.of(RotaChannels.POLICY, policyConfig)));
        // An RPC that fails UNAVAILABLE before any response (its instance died under it) is
        // picked again once, with the next ticket.
        config.put("methodConfig", List.of(Map.of("name", List.of(Map.of()), "retryPolicy", Map.of(
                "maxAttempts", 2.0, "initialBackoff", "0.01s", "maxBackoff", "0.01s", "backoffMultiplier", 1.0,
                "retryableStatusCodes", List.of("UNAVAILABLE")))));
        listener.onResult2(ResolutionResult.newBuilder()
                .setAddressesOrError(StatusOr.fromValue(groups))
                .setAttributes(Attributes.newBuilder().set(RotaLink.KEY, link).build())
                .setServiceConfig(parser.parseServiceConfig(config))
                .build());
    }

    private void ended(Observer observer, Status status) {
        if (shutdown || observer.call != call) {
            return;
        }
        call = null;
        long delay = BACKOFF.delay(Math.min(failures, 30)).toMillis();
        failures++;
        if (!everSynced) {
            listener.onError(Status.UNAVAILABLE.withDescription("cannot watch service \"" + service + "\" at rota "
                    + server + ": " + status.getCode() + (status.getDescription() != null ? ": " + status.getDescription() : ""))
                    .withCause(status.getCause()));
        } else if (failures == 1) {
            // rota is gone (or restarting with a new counter): stop drawing held tickets.
            link.watchLost();
            LOG.log(Level.WARNING, "watch of " + service + " at rota " + server + " ended (" + status.getCode()
                    + "); keeping " + instances.size() + " last known instances, reconnecting");
        }
        retry = link.scheduler.schedule(() -> sync.execute(() -> {
            link.resetConnectBackoff();
            watch();
        }), delay, TimeUnit.MILLISECONDS);
    }

    boolean published() {
        return published;
    }

    private final class Observer implements ClientResponseObserver<WatchRequest, WatchEvent> {
        private ClientCallStreamObserver<WatchRequest> call;

        @Override
        public void beforeStart(ClientCallStreamObserver<WatchRequest> requestStream) {
            this.call = requestStream;
            sync.execute(() -> RotaNameResolver.this.call = requestStream);
        }

        @Override
        public void onNext(WatchEvent event) {
            sync.execute(() -> apply(event));
        }

        @Override
        public void onError(Throwable t) {
            sync.execute(() -> ended(this, Status.fromThrowable(t)));
        }

        @Override
        public void onCompleted() {
            sync.execute(() -> ended(this, Status.UNAVAILABLE.withDescription("watch ended")));
        }
    }
}
