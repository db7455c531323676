package io.rota.client.channel;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import com.google.common.net.InetAddresses;

import io.grpc.ConnectivityState;
import io.grpc.ConnectivityStateInfo;
import io.grpc.EquivalentAddressGroup;
import io.grpc.LoadBalancer;
import io.grpc.Status;
import io.rota.client.RotaCredentials;

/**
 * One subchannel per instance the resolver hands over, and one {@link Rotation} per version
 * asked for; publishes a {@link RotaPicker} over the READY subchannels after every change. Each
 * instance has a {@link HoldOut} counting its timeouts, for as long as its subchannel lives.
 * Runs in the channel's synchronization context, except for the rotations' lease callbacks,
 * which post back into it.
 *
 * <p>The same balancer is rota's xDS policy ({@link RotaXdsLoadBalancerProvider}) when built with
 * an {@link XdsSettings}: its instances are then the endpoints xDS gave it (of one cluster and
 * locality, no rota ids), keyed by {@code host:port}, its link to rota is its own (to the
 * registered address, for the config's service), the config is the cluster's
 * ({@link RotaXdsLoadBalancerProvider.XdsConfig}), and a leased instance is routed to the
 * subchannel of its address; an instance of the lease that xDS did not give is unusable.
 */
final class RotaLoadBalancer extends LoadBalancer {
    /** Longest wait for a new subchannel's first connection before RPCs skip it. */
    static final long SETTLE_TIMEOUT_MS = 2000;

    /** What rota's xDS policy was registered with: rota's address, its credentials (from the environment) and the ticket header. */
    record XdsSettings(String server, RotaCredentials credentials, boolean ticketHeader) {
    }

    private final Helper helper;
    /** Null for the {@code rota} policy behind the rota resolver. */
    private final XdsSettings xds;
    /** Subchannels, states, members and holds are keyed by instance id, or by {@code host:port} under xDS. */
    private final Map<String, Subchannel> subchannels = new HashMap<>();
    private final Map<String, ConnectivityState> states = new HashMap<>();
    private final Map<String, Member> members = new HashMap<>();
    private final Map<String, HoldOut> holds = new HashMap<>();
    private final java.util.function.LongSupplier clock;
    /** Instances whose subchannel has been READY or TRANSIENT_FAILURE at least once (or waited long enough). */
    private final java.util.Set<String> settled = new java.util.HashSet<>();
    private final ConcurrentHashMap<String, Rotation> rotations = new ConcurrentHashMap<>();
    private volatile List<Member> resolved = List.of();
    /** Which instances the channel holds unusable, as of the last {@link #publish}: what leases exclude. */
    private volatile java.util.function.Predicate<Member> unusable = member -> false;
    private RotaLink link;
    private RotaLoadBalancerProvider.PolicyConfig config = new RotaLoadBalancerProvider.PolicyConfig("", "", false);
    private Status lastFailure = Status.UNAVAILABLE.withDescription("no instance connected yet");
    private ConnectivityState current;
    private boolean shutdown;

    RotaLoadBalancer(Helper helper) {
        this(helper, System::nanoTime);
    }

    /** @param clock the hold-outs' clock, in nanoseconds as {@link System#nanoTime} counts them */
    RotaLoadBalancer(Helper helper, java.util.function.LongSupplier clock) {
        this(helper, clock, null);
    }

    /** rota's xDS policy, leasing from {@code xds.server()}. */
    RotaLoadBalancer(Helper helper, XdsSettings xds) {
        this(helper, System::nanoTime, xds);
    }

    private RotaLoadBalancer(Helper helper, java.util.function.LongSupplier clock, XdsSettings xds) {
        this.helper = helper;
        this.clock = clock;
        this.xds = xds;
    }

    @Override
    public Status acceptResolvedAddresses(ResolvedAddresses resolvedAddresses) {
        if (xds != null) {
            return acceptXds(resolvedAddresses);
        }
        RotaLink newLink = resolvedAddresses.getAttributes().get(RotaLink.KEY);
        if (newLink == null) {
            Status status = Status.FAILED_PRECONDITION.withDescription(
                    "the rota load-balancing policy needs the rota name resolver: target rota:///SERVICE");
            handleNameResolutionError(status);
            return status;
        }
        Object parsed = resolvedAddresses.getLoadBalancingPolicyConfig();
        RotaLoadBalancerProvider.PolicyConfig newConfig = parsed instanceof RotaLoadBalancerProvider.PolicyConfig c ? c : config;
        if (newLink != link || !newConfig.equals(config)) {
            rotations.clear();
        }
        link = newLink;
        config = newConfig;
        newLink.onWatchLost(() -> rotations.values().forEach(Rotation::lost));

        Map<String, EquivalentAddressGroup> wanted = new HashMap<>();
        List<Member> all = new ArrayList<>();
        for (EquivalentAddressGroup group : resolvedAddresses.getAddresses()) {
            String id = group.getAttributes().get(RotaNameResolver.ID);
            if (id == null) {
                continue;
            }
            wanted.put(id, group);
            java.net.InetSocketAddress address = (java.net.InetSocketAddress) group.getAddresses().get(0);
            Member member = new Member(id, address.getHostString(), address.getPort(),
                    group.getAttributes().get(RotaNameResolver.VERSION), group.getAttributes().get(RotaNameResolver.WEIGHT));
            all.add(member);
        }
        update(wanted, all);
        return Status.OK;
    }

    /**
     * rota's xDS policy: the endpoints of one locality of the cluster, each keyed by its
     * {@code host:port}, standing for the instances of the config's lease; the link is this
     * balancer's own, replaced when the config names another service.
     */
    private Status acceptXds(ResolvedAddresses resolvedAddresses) {
        if (!(resolvedAddresses.getLoadBalancingPolicyConfig() instanceof RotaXdsLoadBalancerProvider.XdsConfig cluster)) {
            Status status = Status.INTERNAL.withDescription("rota's xDS policy got no config of its own: "
                    + resolvedAddresses.getLoadBalancingPolicyConfig());
            handleNameResolutionError(status);
            return status;
        }
        RotaLoadBalancerProvider.PolicyConfig newConfig = new RotaLoadBalancerProvider.PolicyConfig(cluster.rule(),
                cluster.version(), xds.ticketHeader());
        if (link == null || !link.service.equals(cluster.service())) {
            if (link != null) {
                link.close();
            }
            link = new RotaLink(xds.server(), cluster.service(), xds.credentials());
            RotaLink watched = link;
            // No watch tells this balancer that rota went away: its connection to rota does.
            watched.watchConnection(() -> helper.getSynchronizationContext().execute(() -> {
                if (watched == link && !shutdown) {
                    rotations.values().forEach(Rotation::lost);
                }
            }));
            rotations.clear();
        } else if (!newConfig.equals(config)) {
            rotations.clear();
        }
        config = newConfig;

        Map<String, EquivalentAddressGroup> wanted = new HashMap<>();
        List<Member> all = new ArrayList<>();
        for (EquivalentAddressGroup group : resolvedAddresses.getAddresses()) {
            if (group.getAddresses().isEmpty() || !(group.getAddresses().get(0) instanceof java.net.InetSocketAddress address)) {
                continue;
            }
            String host = address.getAddress() != null ? InetAddresses.toAddrString(address.getAddress())
                    : Member.canonicalHost(address.getHostString());
            // Until a lease lists the instances, the local rotation goes over these, by address.
            Member member = new Member(host + ":" + address.getPort(), host, address.getPort(), cluster.version(), 100);
            if (wanted.putIfAbsent(member.address(), group) == null) {
                all.add(member);
            }
        }
        update(wanted, all);
        if (wanted.isEmpty()) {
            return Status.UNAVAILABLE.withDescription("xDS gave rota's policy no endpoint of " + cluster.service());
        }
        return Status.OK;
    }

    /** Brings the subchannels to {@code wanted} (by key), the members to {@code all}, and publishes. */
    private void update(Map<String, EquivalentAddressGroup> wanted, List<Member> all) {
        boolean changed = !members.keySet().equals(wanted.keySet());
        for (String id : new ArrayList<>(subchannels.keySet())) {
            EquivalentAddressGroup group = wanted.get(id);
            if (group == null || !group.getAddresses().equals(subchannels.get(id).getAddresses().getAddresses())) {
                subchannels.remove(id).shutdown();
                states.remove(id);
                holds.remove(id);
                settled.remove(id);
                changed = true;
            }
        }
        for (Map.Entry<String, EquivalentAddressGroup> entry : wanted.entrySet()) {
            if (subchannels.containsKey(entry.getKey())) {
                continue;
            }
            String id = entry.getKey();
            Subchannel subchannel = helper.createSubchannel(CreateSubchannelArgs.newBuilder()
                    .setAddresses(entry.getValue()).build());
            subchannels.put(id, subchannel);
            states.put(id, ConnectivityState.IDLE);
            holds.put(id, new HoldOut(clock));
            subchannel.start(state -> onState(id, subchannel, state));
            subchannel.requestConnection();
            helper.getScheduledExecutorService().schedule(() -> helper.getSynchronizationContext().execute(() -> {
                if (subchannels.get(id) == subchannel && settled.add(id)) {
                    publish();
                }
            }), SETTLE_TIMEOUT_MS, java.util.concurrent.TimeUnit.MILLISECONDS);
        }
        members.clear();
        all.forEach(m -> members.put(xds != null ? m.address() : m.id(), m));
        resolved = List.copyOf(all);
        // Published first, so that the refreshed rotations' leases exclude what the new list
        // holds unusable (a new instance's first connection is waited for, not excluded).
        publish();
        if (changed) {
            rotations.values().forEach(Rotation::refresh);
        }
    }

    /** The key of a member's subchannel: its id, or under xDS its {@code host:port}. */
    String key(Member member) {
        return xds != null ? member.address() : member.id();
    }

    /** Whether RPCs choose their version with {@value RotaChannels#VERSION_HEADER}: not under xDS, whose routes did (per cluster). */
    boolean versionFromHeader() {
        return xds == null;
    }

    @Override
    public void handleNameResolutionError(Status error) {
        if (subchannels.isEmpty()) {
            current = ConnectivityState.TRANSIENT_FAILURE;
            helper.updateBalancingState(ConnectivityState.TRANSIENT_FAILURE, new FixedResultPicker(PickResult.withError(error)));
        }
    }

    @Override
    public void shutdown() {
        shutdown = true;
        subchannels.values().forEach(Subchannel::shutdown);
        subchannels.clear();
        rotations.clear();
        if (xds != null && link != null) {
            // The xDS policy's link is its own (the rota resolver's belongs to the resolver).
            link.close();
        }
    }

    @Override
    public void requestConnection() {
        subchannels.values().forEach(Subchannel::requestConnection);
    }

    private void onState(String id, Subchannel subchannel, ConnectivityStateInfo info) {
        if (shutdown || subchannels.get(id) != subchannel) {
            return;
        }
        states.put(id, info.getState());
        if (info.getState() == ConnectivityState.READY || info.getState() == ConnectivityState.TRANSIENT_FAILURE) {
            settled.add(id);
        }
        if (info.getState() == ConnectivityState.TRANSIENT_FAILURE) {
            lastFailure = info.getStatus();
        }
        if (info.getState() == ConnectivityState.IDLE) {
            subchannel.requestConnection();
        }
        publish();
    }

    private void publish() {
        if (shutdown) {
            return;
        }
        Map<String, RotaPicker.Ready> ready = new HashMap<>();
        boolean connecting = false;
        for (Map.Entry<String, ConnectivityState> entry : states.entrySet()) {
            if (entry.getValue() == ConnectivityState.READY) {
                ready.put(entry.getKey(), new RotaPicker.Ready(subchannels.get(entry.getKey()), holds.get(entry.getKey())));
            } else if (entry.getValue() == ConnectivityState.CONNECTING || entry.getValue() == ConnectivityState.IDLE) {
                connecting = true;
            }
        }
        // Unusable: held out, or without a READY subchannel, except while making its first
        // connection (RPCs wait for that one rather than skip it).
        Map<String, RotaPicker.Ready> readyNow = Map.copyOf(ready);
        java.util.Set<String> connectingFirst = new java.util.HashSet<>(subchannels.keySet());
        connectingFirst.removeAll(settled);
        unusable = member -> {
            String key = key(member);
            RotaPicker.Ready r = readyNow.get(key);
            return r != null ? r.hold().heldOut() : !connectingFirst.contains(key);
        };
        ConnectivityState state = !ready.isEmpty() ? ConnectivityState.READY
                : connecting ? ConnectivityState.CONNECTING : ConnectivityState.TRANSIENT_FAILURE;
        current = state;
        Status failure = Status.UNAVAILABLE.withDescription("no instance of " + (link != null ? link.service : "the service")
                + " is reachable: " + lastFailure.getCode() + (lastFailure.getDescription() != null ? ": " + lastFailure.getDescription() : ""));
        // While a new subchannel makes its first connection, RPCs wait rather than skip it, so
        // a channel's first tickets (and those after an instance joins) go where rota mapped them.
        boolean unsettled = !settled.containsAll(subchannels.keySet());
        helper.updateBalancingState(state, new RotaPicker(this, unsettled ? Map.of() : readyNow,
                unsettled ? ConnectivityState.CONNECTING : state, connecting || unsettled, failure, config));
    }

    /** Publishes a new picker so that RPCs waiting for a first lease are picked again. */
    void repick() {
        helper.getSynchronizationContext().execute(this::publish);
    }

    Rotation rotation(String version) {
        return rotations.computeIfAbsent(version, v -> new Rotation(link, config.rule(), v, () -> resolved, this::repick,
                member -> unusable.test(member)));
    }

    RotaLink link() {
        return link;
    }

    ConnectivityState state() {
        return current;
    }
}
