package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.Instance;
import io.rota.v1.InstanceList;
import io.rota.v1.InstanceStatus;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.LeasedPick;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.ReportRequest;
import io.rota.v1.ReportResponse;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * A rota:/// channel against a scripted rota that answers every version-less lease with picks
 * (gray release: two unversioned instances and one of v2, split 2:1), and real echo servers: the
 * calls follow the picks exactly, and a killed instance's picks are passed over without a failed call.
 */
class GrayChannelTest {
    private final EchoFleet fleet = new EchoFleet();
    private final List<Instance> instances = new ArrayList<>();
    private final AtomicLong picked = new AtomicLong();
    private final AtomicLong unversioned = new AtomicLong();
    private final AtomicLong v2 = new AtomicLong();
    private Server rota;
    private ManagedChannel channel;

    @BeforeEach
    void start() throws Exception {
        for (String id : List.of("echo-a", "echo-b", "echo-v")) {
            instances.add(Instance.newBuilder().setService("echo").setId(id).setHost("127.0.0.1").setPort(fleet.start(id))
                    .setVersion(id.equals("echo-v") ? "v2" : "").setStatus(InstanceStatus.UP).build());
        }
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new RegistryGrpc.RegistryImplBase() {
                    @Override
                    public void watch(WatchRequest request, StreamObserver<WatchEvent> response) {
                        // The snapshot; the stream stays open.
                        response.onNext(WatchEvent.newBuilder().setEpoch(1)
                                .setSnapshot(InstanceList.newBuilder().addAllInstances(instances)).build());
                    }
                })
                .addService(new BalancerGrpc.BalancerImplBase() {
                    @Override
                    public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
                        LeaseResponse.Builder answer = LeaseResponse.newBuilder().setRule("round_robin").setEpoch(1)
                                .addAllInstances(instances);
                        if (request.getVersion().isEmpty()) {
                            for (int i = 0; i < request.getCount(); i++) {
                                if (picked.getAndIncrement() % 3 == 0) {
                                    answer.addPicks(LeasedPick.newBuilder().setTicket(v2.getAndIncrement()).setPosition(2));
                                } else {
                                    long t = unversioned.getAndIncrement();
                                    answer.addPicks(LeasedPick.newBuilder().setTicket(t).setPosition((int) (t % 2)));
                                }
                            }
                            answer.setCount(answer.getPicksCount());
                        } else {
                            answer.setFirstTicket(v2.getAndAdd(request.getCount())).setCount(request.getCount())
                                    .clearInstances().addInstances(instances.get(2));
                            for (int i = 0; i < request.getCount(); i++) {
                                answer.addPositions(0);
                            }
                        }
                        response.onNext(answer.build());
                        response.onCompleted();
                    }

                    @Override
                    public void report(ReportRequest request, StreamObserver<ReportResponse> response) {
                        response.onNext(ReportResponse.newBuilder().setAccepted(request.getOutcomesCount()).build());
                        response.onCompleted();
                    }
                }).build().start();
        channel = ManagedChannelBuilder.forTarget("rota://127.0.0.1:" + rota.getPort() + "/echo")
                .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true)
                .usePlaintext().build();
    }

    @AfterEach
    void stop() throws Exception {
        channel.shutdownNow();
        rota.shutdownNow();
        fleet.close();
    }

    private void calls(int n) {
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
        for (int i = 0; i < n; i++) {
            stub.withDeadlineAfter(5, TimeUnit.SECONDS).echo(EchoRequest.newBuilder().setMessage("gray").build());
        }
    }

    private static Map<String, Integer> counts(List<EchoFleet.Received> received) {
        Map<String, Integer> counts = new TreeMap<>();
        received.forEach(r -> counts.merge(r.instance(), 1, Integer::sum));
        return counts;
    }

    @Test
    void callsFollowThePicksAndTheirTickets() {
        calls(60);
        List<EchoFleet.Received> received = List.copyOf(fleet.received);
        assertEquals(Map.of("echo-a", 20, "echo-b", 20, "echo-v", 20), counts(received));
        // Each instance saw the tickets of its own version's rotation, each once.
        Set<String> seen = new HashSet<>();
        for (EchoFleet.Received r : received) {
            assertNotNull(r.ticket(), "a call without a ticket");
            assertTrue(!r.ticket().startsWith("L"), "a local pick: " + r);
            String version = r.instance().equals("echo-v") ? "v2" : "";
            assertTrue(seen.add(version + "/" + r.ticket()), "ticket " + r.ticket() + " of \"" + version + "\" used twice");
        }
        for (int i = 0; i < received.size(); i++) {
            assertEquals(i % 3 == 0, received.get(i).instance().equals("echo-v"), "call " + i + ": " + received.get(i));
        }
    }

    @Test
    void aKilledInstancesPicksArePassedOverWithoutAFailedCall() throws Exception {
        calls(6);
        fleet.kill("echo-v");
        // A call already on its way to echo-v when it died may fail; after one gets through, none may.
        boolean through = false;
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
        for (int i = 0; i < 10 && !through; i++) {
            try {
                stub.withDeadlineAfter(5, TimeUnit.SECONDS).echo(EchoRequest.newBuilder().setMessage("gray").build());
                through = true;
            } catch (io.grpc.StatusRuntimeException e) {
                // the call that was on its way
            }
        }
        assertTrue(through, "no call got through after the kill");
        int before = fleet.received.size();
        calls(30);
        List<EchoFleet.Received> all = List.copyOf(fleet.received);
        Map<String, Integer> after = counts(all.subList(before, all.size()));
        assertEquals(Set.of("echo-a", "echo-b"), after.keySet(), after.toString());
        assertEquals(30, after.values().stream().mapToInt(Integer::intValue).sum());
    }
}
