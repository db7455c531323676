package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import io.grpc.EquivalentAddressGroup;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.NameResolver;
import io.grpc.NameResolverProvider;
import io.grpc.NameResolverRegistry;
import io.grpc.StatusOr;
import io.rota.client.Backoff;
import io.rota.client.Instance;
import io.rota.client.RotaClient;
import io.rota.client.testing.Await;
import io.rota.client.testing.RotaServer;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * rota's xDS policy ({@value RotaChannels#XDS_POLICY}) in a channel as grpc-xds would run it: the
 * endpoints of one cluster as addresses without rota's ids (a fixed list standing in for EDS),
 * the cluster's config {@code {"service": "echo"}}, rota's address from the registration. Against
 * a live rota and three echo servers recording each RPC's ticket.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class XdsPolicyChannelTest {
    private static final String SCHEME = "xds-standin";
    private static final List<String> IDS = List.of("echo-a", "echo-b", "echo-c");

    private RotaServer rota;
    private RotaClient provider;
    private EchoFleet fleet;
    private final Map<String, InetSocketAddress> addresses = new TreeMap<>();
    private final List<ManagedChannel> channels = new ArrayList<>();
    private FixedEndpoints endpoints;

    @BeforeEach
    void start() throws Exception {
        rota = RotaServer.start();
        fleet = new EchoFleet();
        provider = RotaClient.builder().target(rota.target())
                .backoff(Backoff.exponential(Duration.ofMillis(20), Duration.ofMillis(200))).build();
        List<Instance> instances = new ArrayList<>();
        for (String id : IDS) {
            int port = fleet.start(id);
            addresses.put(id, new InetSocketAddress("127.0.0.1", port));
            instances.add(Instance.of("echo", "127.0.0.1", port).withId(id));
        }
        provider.register(instances);
        RotaChannels.registerXdsPolicy(rota.target(), XdsPolicyOptions.defaults().withTicketHeader(true));
    }

    @AfterEach
    void stop() throws Exception {
        RotaChannels.deregisterXdsPolicy();
        if (endpoints != null) {
            NameResolverRegistry.getDefaultRegistry().deregister(endpoints);
        }
        channels.forEach(ManagedChannel::shutdownNow);
        provider.close();
        fleet.close();
        rota.close();
    }

    /** A channel whose "xDS" gives the policy these instances' endpoints only. */
    private EchoGrpc.EchoBlockingStub channel(List<String> given) {
        List<EquivalentAddressGroup> groups = new ArrayList<>();
        given.forEach(id -> groups.add(new EquivalentAddressGroup(addresses.get(id))));
        endpoints = new FixedEndpoints(groups);
        NameResolverRegistry.getDefaultRegistry().register(endpoints);
        ManagedChannel channel = ManagedChannelBuilder.forTarget(SCHEME + ":///echo")
                .defaultServiceConfig(Map.of("loadBalancingConfig", List.of(Map.of(RotaChannels.XDS_POLICY,
                        Map.of("service", "echo", "version", "", "rule", "round_robin", "unknown", "ignored")))))
                .usePlaintext()
                .build();
        channels.add(channel);
        return EchoGrpc.newBlockingStub(channel);
    }

    private static void echo(EchoGrpc.EchoBlockingStub stub) {
        stub.withDeadlineAfter(10, TimeUnit.SECONDS).echo(EchoRequest.newBuilder().setMessage("xds").build());
    }

    @Test
    void ticketsGoToTheEndpointOfTheirInstanceAndAnInstanceXdsDidNotGiveIsUnusable() {
        // echo-c is leased by rota but not among the endpoints. The first lease (tickets 0..15,
        // the first block's size) knows nothing of it: rota maps those over a, b, c (t mod 3) and
        // echo-c's tickets are passed over. Every later lease excludes echo-c: rota maps those
        // over a, b (t mod 2).
        EchoGrpc.EchoBlockingStub stub = channel(List.of("echo-a", "echo-b"));
        for (int i = 0; i < 60; i++) {
            echo(stub);
        }
        List<EchoFleet.Received> received = List.copyOf(fleet.received);
        assertEquals(60, received.size());
        TreeMap<Long, String> tickets = new TreeMap<>();
        for (EchoFleet.Received r : received) {
            assertNotNull(r.ticket(), "every RPC carries its ticket");
            assertFalse(r.ticket().startsWith("L"), "a local pick while rota is up: " + r.ticket());
            assertNull(tickets.put(Long.parseUnsignedLong(r.ticket()), r.instance()), "ticket " + r.ticket() + " used twice");
        }
        int excluded = 0;
        for (Map.Entry<Long, String> e : tickets.entrySet()) {
            long t = e.getKey();
            String wanted = t < RotaChannels.MIN_BLOCK ? IDS.get((int) (t % 3)) : List.of("echo-a", "echo-b").get((int) (t % 2));
            assertEquals(wanted, e.getValue(), "ticket " + t);
            excluded += t >= RotaChannels.MIN_BLOCK ? 1 : 0;
        }
        for (long t = 2; t < RotaChannels.MIN_BLOCK; t += 3) {
            assertFalse(tickets.containsKey(t), "echo-c's ticket " + t + " was sent");
        }
        assertTrue(excluded >= 40, "tickets of leases excluding echo-c: " + excluded);
    }

    @Test
    void whileRotaIsUnreachableALocalRotationGoesOn() throws Exception {
        EchoGrpc.EchoBlockingStub stub = channel(IDS);
        for (int i = 0; i < 6; i++) {
            echo(stub);
        }
        assertTrue(fleet.received.stream().allMatch(r -> r.ticket() != null && !r.ticket().startsWith("L")));
        rota.kill();
        // No watch: the lost connection to rota drops the held tickets (a restarted rota counts
        // from 0 again) and the local rotation takes over; no RPC fails meanwhile.
        int before = fleet.received.size();
        Await.until("a local pick after rota was killed", Duration.ofSeconds(20), () -> {
            echo(stub);
            return fleet.received.stream().skip(before).anyMatch(r -> r.ticket() != null && r.ticket().startsWith("L"));
        });
        int local = fleet.received.size();
        for (int i = 0; i < 30; i++) {
            echo(stub);
        }
        List<EchoFleet.Received> after = List.copyOf(fleet.received).subList(local, local + 30);
        assertTrue(after.stream().allMatch(r -> r.ticket().startsWith("L")), "local picks only while rota is down");
        assertEquals(Map.of("echo-a", 10L, "echo-b", 10L, "echo-c", 10L), count(after), "the local rotation is round_robin");
    }

    private static Map<String, Long> count(List<EchoFleet.Received> received) {
        Map<String, Long> out = new TreeMap<>();
        received.forEach(r -> out.merge(r.instance(), 1L, Long::sum));
        return out;
    }

    /** The stand-in for EDS: fixed addresses, no ids, no service config. */
    private static final class FixedEndpoints extends NameResolverProvider {
        private final List<EquivalentAddressGroup> groups;

        FixedEndpoints(List<EquivalentAddressGroup> groups) {
            this.groups = List.copyOf(groups);
        }

        @Override
        protected boolean isAvailable() {
            return true;
        }

        @Override
        protected int priority() {
            return 4;
        }

        @Override
        public String getDefaultScheme() {
            return SCHEME;
        }

        @Override
        public Collection<Class<? extends SocketAddress>> getProducedSocketAddressTypes() {
            return List.of(InetSocketAddress.class);
        }

        @Override
        public NameResolver newNameResolver(URI target, NameResolver.Args args) {
            if (!SCHEME.equals(target.getScheme())) {
                return null;
            }
            return new NameResolver() {
                @Override
                public String getServiceAuthority() {
                    return "echo";
                }

                @Override
                public void start(Listener2 listener) {
                    listener.onResult2(ResolutionResult.newBuilder().setAddressesOrError(StatusOr.fromValue(groups)).build());
                }

                @Override
                public void shutdown() {
                }
            };
        }
    }
}
