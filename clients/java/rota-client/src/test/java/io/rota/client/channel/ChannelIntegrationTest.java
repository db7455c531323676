package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import io.rota.client.Backoff;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.testing.Await;
import io.rota.client.testing.RotaServer;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoReply;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * rota:/// channels against a live rota server and three echo servers on loopback ports. Every
 * echo server records the ticket header of each RPC, so the tests check the rotation ticket by
 * ticket: no ticket is used twice across channels, and each reached the instance rota's rule
 * maps it to.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class ChannelIntegrationTest {
    private static final List<String> IDS = List.of("echo-a", "echo-b", "echo-c");

    private RotaServer rota;
    private RotaClient provider;
    private Registration registration;
    private EchoFleet fleet;
    private final Map<String, Instance> instances = new HashMap<>();
    private final List<ManagedChannel> channels = new ArrayList<>();

    @BeforeEach
    void start() throws Exception {
        rota = RotaServer.start();
        fleet = new EchoFleet();
        provider = RotaClient.builder().target(rota.target())
                .backoff(Backoff.exponential(Duration.ofMillis(20), Duration.ofMillis(200))).build();
        for (String id : IDS) {
            instances.put(id, Instance.of("echo", "127.0.0.1", fleet.start(id)).withId(id));
        }
        registration = provider.register(List.copyOf(instances.values()));
    }

    @AfterEach
    void stop() throws Exception {
        channels.forEach(ManagedChannel::shutdownNow);
        provider.close();
        fleet.close();
        rota.close();
    }

    private EchoGrpc.EchoBlockingStub channel(String rule) {
        ManagedChannel channel = ManagedChannelBuilder.forTarget("rota://" + rota.target() + "/echo")
                .setNameResolverArg(RotaChannels.RULE, rule)
                .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true)
                .usePlaintext()
                .build();
        channels.add(channel);
        return EchoGrpc.newBlockingStub(channel);
    }

    private static EchoReply echo(EchoGrpc.EchoBlockingStub stub, String message) {
        return stub.withDeadlineAfter(20, TimeUnit.SECONDS).echo(EchoRequest.newBuilder().setMessage(message).build());
    }

    /** Leased tickets as the echo servers received them: ticket → instance; fails on a ticket used twice. */
    private TreeMap<Long, String> leasedTickets(List<EchoFleet.Received> received) {
        TreeMap<Long, String> tickets = new TreeMap<>(Long::compareUnsigned);
        for (EchoFleet.Received r : received) {
            assertNotNull(r.ticket(), "every RPC carries its ticket");
            if (r.ticket().startsWith("L")) {
                continue;
            }
            String previous = tickets.put(Long.parseUnsignedLong(r.ticket()), r.instance());
            assertNull(previous, "ticket " + r.ticket() + " used twice (" + previous + ", " + r.instance() + ")");
        }
        return tickets;
    }

    /** Two channels alternating: one rotation, each ticket on the instance rota maps it to, exact cycles. */
    private void twoChannelsShareOneRotation(String rule, int group) throws Exception {
        EchoGrpc.EchoBlockingStub first = channel(rule);
        EchoGrpc.EchoBlockingStub second = channel(rule);
        for (int i = 0; i < 300; i++) {
            echo(i % 2 == 0 ? first : second, "rpc " + i);
        }
        TreeMap<Long, String> tickets = leasedTickets(List.copyOf(fleet.received));
        assertEquals(300, tickets.size(), "every RPC routed by a leased ticket");
        int cycles = 0;
        for (Map.Entry<Long, String> entry : tickets.entrySet()) {
            long t = entry.getKey();
            assertEquals(IDS.get((int) ((t / group) % IDS.size())), entry.getValue(), rule + " ticket " + t);
            long start = t - t % (group * IDS.size());
            if (t == start && tickets.subMap(start, start + group * IDS.size()).size() == group * IDS.size()) {
                Map<String, Integer> shares = new HashMap<>();
                tickets.subMap(start, start + group * IDS.size()).values().forEach(id -> shares.merge(id, 1, Integer::sum));
                assertEquals(Map.of("echo-a", group, "echo-b", group, "echo-c", group), shares, "cycle from " + start);
                cycles++;
            }
        }
        assertTrue(cycles >= 300 / (group * IDS.size()) / 2, "complete cycles seen: " + cycles);
    }

    @Test
    void ticketHeaderIsSentOnlyWhenAskedFor() throws Exception {
        ManagedChannel plain = ManagedChannelBuilder.forTarget("rota://" + rota.target() + "/echo").usePlaintext().build();
        channels.add(plain);
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(plain);
        for (int i = 0; i < 20; i++) {
            echo(stub, "rpc " + i);
        }
        assertEquals(20, fleet.received.size());
        assertTrue(fleet.received.stream().allMatch(r -> r.ticket() == null), "no x-rota-ticket by default");
        EchoGrpc.EchoBlockingStub opted = channel("round_robin");
        for (int i = 0; i < 20; i++) {
            echo(opted, "rpc " + i);
        }
        assertEquals(20, leasedTickets(List.copyOf(fleet.received).subList(20, 40)).size());
    }

    @Test
    void roundRobinOverTwoChannelsIsOneRotation() throws Exception {
        twoChannelsShareOneRotation("round_robin", 1);
    }

    @Test
    void repeatOverTwoChannelsGivesRunsOfThree() throws Exception {
        twoChannelsShareOneRotation("repeat(n=3)", 3);
    }

    @Test
    void versionHeaderReachesOnlyThatVersion() throws Exception {
        Instance zlt = Instance.of("echo", "127.0.0.1", fleet.start("echo-zlt")).withId("echo-zlt").withVersion("zlt");
        registration.announce(zlt);
        EchoGrpc.EchoBlockingStub plain = channel("round_robin");
        Metadata headers = new Metadata();
        headers.put(RotaChannels.VERSION_KEY, "zlt");
        EchoGrpc.EchoBlockingStub versioned = plain.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
        Set<String> plainReached = new HashSet<>();
        for (int i = 0; i < 30; i++) {
            assertEquals("echo-zlt", echo(versioned, "zlt " + i).getInstanceId());
            plainReached.add(echo(plain, "plain " + i).getInstanceId());
        }
        assertEquals(Set.copyOf(IDS), plainReached, "calls without the header stay off the zlt instance");
    }

    @Test
    void withdrawnInstanceStopsReceivingWithinOneSecond() throws Exception {
        EchoGrpc.EchoBlockingStub stub = channel("round_robin");
        for (int i = 0; i < 30; i++) {
            echo(stub, "before " + i);
        }
        registration.withdraw(instances.get("echo-c").ref());
        long withdrawn = System.nanoTime();
        Map<String, Integer> late = new HashMap<>();
        // RPCs for two seconds after the withdrawal's acknowledgement.
        while (System.nanoTime() - withdrawn < TimeUnit.SECONDS.toNanos(2)) {
            echo(stub, "after");
        }
        for (EchoFleet.Received r : fleet.since(withdrawn + TimeUnit.SECONDS.toNanos(1))) {
            late.merge(r.instance(), 1, Integer::sum);
        }
        assertNull(late.get("echo-c"), "echo-c received RPCs more than 1 s after its withdrawal: " + late);
        assertTrue(late.getOrDefault("echo-a", 0) > 0 && late.getOrDefault("echo-b", 0) > 0, late.toString());
    }

    @Test
    void killedInstanceIsSkippedWithoutFailingRpcs() throws Exception {
        EchoGrpc.EchoBlockingStub stub = channel("round_robin");
        for (int i = 0; i < 30; i++) {
            echo(stub, "before " + i);
        }
        fleet.kill("echo-c");
        long killed = System.nanoTime();
        Map<String, Integer> reached = new HashMap<>();
        for (int i = 0; i < 200; i++) {
            reached.merge(echo(stub, "after " + i).getInstanceId(), 1, Integer::sum);
        }
        assertEquals(Set.of("echo-a", "echo-b"), reached.keySet());
        assertTrue(fleet.since(killed).stream().noneMatch(r -> r.instance().equals("echo-c")));
    }

    @Test
    void rotaStoppedRpcsGoOnAndLeasesResumeWhenItIsBack() throws Exception {
        EchoGrpc.EchoBlockingStub stub = channel("round_robin");
        for (int i = 0; i < 30; i++) {
            echo(stub, "before " + i);
        }
        String address = rota.target();
        rota.kill();
        long stopped = System.nanoTime();
        Map<String, Integer> reached = new HashMap<>();
        for (int i = 0; i < 100; i++) {
            reached.merge(echo(stub, "outage " + i).getInstanceId(), 1, Integer::sum);
        }
        assertEquals(Set.copyOf(IDS), reached.keySet(), "the local rotation covers every known instance");
        assertTrue(fleet.since(stopped).stream().anyMatch(r -> r.ticket().startsWith("L")), "local picks during the outage");

        rota = RotaServer.startOn(address);
        Await.until("the provider registered again", Duration.ofSeconds(30), registration::isConnected);
        long restarted = System.nanoTime();
        Await.until("RPCs routed by leased tickets again", Duration.ofSeconds(30), () -> {
            echo(stub, "back");
            List<EchoFleet.Received> since = fleet.since(restarted);
            return !since.isEmpty() && !since.get(since.size() - 1).ticket().startsWith("L");
        });
    }

    @Test
    void aRuleRotaCannotLeaseFailsTheRpcsWithRotasRefusal() {
        // The channel takes any rule string; rota is the one to refuse a rule it cannot lease.
        EchoGrpc.EchoBlockingStub stub = channel("random");
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> echo(stub, "hello"));
        // rota's INVALID_ARGUMENT, which grpc-java turns into INTERNAL coming from a picker (gRFC A54).
        assertEquals(Status.Code.INTERNAL, e.getStatus().getCode(), e.toString());
        assertTrue(e.getStatus().getDescription().contains("\"random\", which cannot be leased"), e.toString());
        assertTrue(fleet.received.isEmpty(), "a call was sent: " + fleet.received);
    }

    @Test
    void unknownServiceFailsFastWithAClearError() {
        ManagedChannel channel = ManagedChannelBuilder.forTarget("rota://" + rota.target() + "/no-such-service")
                .usePlaintext().build();
        channels.add(channel);
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
                () -> echo(EchoGrpc.newBlockingStub(channel), "hello"));
        assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode(), e.toString());
        assertTrue(e.getStatus().getDescription().contains("no-such-service"), e.toString());
        assertFalse(e.getStatus().getDescription().isEmpty());
    }
}
