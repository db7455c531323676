package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.Test;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Server;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.client.testing.Await;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.CallOutcome;
import io.rota.v1.CallResult;
import io.rota.v1.Instance;
import io.rota.v1.InstanceList;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.ReportRequest;
import io.rota.v1.ReportResponse;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/** What the policy sends rota, seen by a recording stand-in: the leases it asks for and the outcomes it reports. */
class OutcomeReportTest {
    private final List<LeaseRequest> leases = new CopyOnWriteArrayList<>();
    private final List<CallOutcome> outcomes = new CopyOnWriteArrayList<>();
    private final AtomicLong tickets = new AtomicLong(1000);
    private final List<Instance> instances = new ArrayList<>();

    @Test
    void everyRpcIsReportedWithItsTicketAndLeasesStayWithinTheBounds() throws Exception {
        try (EchoFleet fleet = new EchoFleet()) {
            for (String id : List.of("echo-a", "echo-b", "echo-c")) {
                instances.add(Instance.newBuilder().setId(id).setService("echo").setHost("127.0.0.1")
                        .setPort(fleet.start(id)).build());
            }
            Server rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                    .addService(new Balancer()).addService(new Registry()).build().start();
            ManagedChannel channel = ManagedChannelBuilder.forTarget("rota://127.0.0.1:" + rota.getPort() + "/echo")
                    .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true).usePlaintext().build();
            try {
                EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
                for (int i = 0; i < 300; i++) {
                    stub.withDeadlineAfter(20, TimeUnit.SECONDS).echo(EchoRequest.newBuilder().setMessage("x").build());
                }
                Await.until("300 outcomes reported", Duration.ofSeconds(20), () -> outcomes.size() >= 300);
                Map<Long, String> received = new HashMap<>();
                fleet.received.forEach(r -> received.put(Long.parseLong(r.ticket()), r.instance()));
                assertEquals(300, outcomes.size());
                for (CallOutcome outcome : outcomes) {
                    assertEquals(CallResult.CALL_RESULT_OK, outcome.getResult());
                    assertEquals("echo", outcome.getService());
                    assertEquals("round_robin", outcome.getRule());
                    assertEquals(received.get(outcome.getTicket()), outcome.getInstanceId(), "ticket " + outcome.getTicket());
                    assertTrue(outcome.getLatencyUs() > 0);
                    assertTrue(outcome.getLeased(), "a leased call never counted in flight at rota");
                }
                assertTrue(leases.stream().filter(l -> l.getCount() > 0).allMatch(
                        l -> l.getCount() >= RotaChannels.MIN_BLOCK && l.getCount() <= RotaChannels.MAX_BLOCK), leases.toString());
                long leased = leases.stream().mapToLong(LeaseRequest::getCount).sum();
                assertTrue(leased >= 300, "leased " + leased);
            } finally {
                channel.shutdownNow();
                rota.shutdownNow();
            }
        }
    }

    private final class Balancer extends BalancerGrpc.BalancerImplBase {
        @Override
        public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
            leases.add(request);
            long first = tickets.getAndAdd(request.getCount());
            response.onNext(FakeLease.roundRobin(instances, request, first).build());
            response.onCompleted();
        }

        @Override
        public void report(ReportRequest request, StreamObserver<ReportResponse> response) {
            outcomes.addAll(request.getOutcomesList());
            response.onNext(ReportResponse.newBuilder().setAccepted(request.getOutcomesCount()).build());
            response.onCompleted();
        }
    }

    private final class Registry extends RegistryGrpc.RegistryImplBase {
        @Override
        public void watch(WatchRequest request, StreamObserver<WatchEvent> response) {
            response.onNext(WatchEvent.newBuilder().setSnapshot(InstanceList.newBuilder().addAllInstances(instances))
                    .setEpoch(1).build());
        }
    }
}
