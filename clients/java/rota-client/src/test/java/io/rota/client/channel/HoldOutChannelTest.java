package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import com.google.common.util.concurrent.ListenableFuture;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.client.testing.Await;
import io.rota.v1.BalancerGrpc;
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
import rota.echo.v1.EchoOuterClass.EchoReply;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * A channel's count of an instance's timeouts, against a scripted rota leasing tickets from 0
 * over echo-a, echo-b, echo-c (ticket t at position t mod 3): which calls count, what becomes of
 * the held-out instance's tickets, and what the leases exclude.
 */
class HoldOutChannelTest {
    private final List<Instance> instances = new ArrayList<>();
    private final AtomicLong tickets = new AtomicLong();
    private final List<LeaseRequest> leases = new java.util.concurrent.CopyOnWriteArrayList<>();
    private EchoFleet fleet;
    private Server rota;
    private ManagedChannel channel;

    @BeforeEach
    void start() throws Exception {
        fleet = new EchoFleet();
        for (String id : List.of("echo-a", "echo-b", "echo-c")) {
            instances.add(Instance.newBuilder().setId(id).setService("echo").setHost("127.0.0.1").setPort(fleet.start(id)).build());
        }
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new Balancer()).addService(new Registry()).build().start();
        channel = ManagedChannelBuilder.forTarget("rota://127.0.0.1:" + rota.getPort() + "/echo")
                .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true).usePlaintext().build();
    }

    @AfterEach
    void stop() throws Exception {
        channel.shutdownNow();
        fleet.close();
        rota.shutdownNow();
    }

    /** One call with this deadline; the instance that answered, or the failure's status code. */
    private String call(long deadlineMs) {
        try {
            EchoReply reply = EchoGrpc.newBlockingStub(channel).withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS)
                    .echo(EchoRequest.newBuilder().setMessage("x").build());
            return reply.getInstanceId();
        } catch (StatusRuntimeException e) {
            return e.getStatus().getCode().toString();
        }
    }

    private List<String> calls(int n, long deadlineMs) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(call(deadlineMs));
        }
        return out;
    }

    /** A call to the hung echo-c that the caller cancels once echo-c has it. */
    private void cancelledCallToC() throws Exception {
        long before = fleet.received.stream().filter(r -> r.instance().equals("echo-c")).count();
        ListenableFuture<EchoReply> call = EchoGrpc.newFutureStub(channel).withDeadlineAfter(20, TimeUnit.SECONDS)
                .echo(EchoRequest.newBuilder().setMessage("x").build());
        Await.until("echo-c received the call", Duration.ofSeconds(10),
                () -> fleet.received.stream().filter(r -> r.instance().equals("echo-c")).count() > before);
        call.cancel(true);
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> {
            try {
                call.get(10, TimeUnit.SECONDS);
            } catch (java.util.concurrent.ExecutionException failed) {
                throw failed.getCause();
            } catch (java.util.concurrent.CancellationException cancelled) {
                throw Status.CANCELLED.asRuntimeException();
            }
        });
        assertEquals(Status.Code.CANCELLED, e.getStatus().getCode());
    }

    @Test
    void threeTimeoutsInARowHoldAnInstanceOutItsTicketsArePassedOverAndLeasesExcludeIt() throws Exception {
        assertEquals(List.of("echo-a", "echo-b", "echo-c"), calls(3, 5000));
        fleet.hang("echo-c");

        // Calls the caller cancels are no timeouts: echo-c keeps its tickets.
        for (int round = 0; round < 3; round++) {
            assertEquals(List.of("echo-a", "echo-b"), calls(2, 5000));
            cancelledCallToC();
        }
        // Two timeouts, then an answer: the count starts over.
        assertEquals(List.of("echo-a", "echo-b", "DEADLINE_EXCEEDED", "echo-a", "echo-b", "DEADLINE_EXCEEDED"), calls(6, 200));
        fleet.resume("echo-c");
        assertEquals(List.of("echo-a", "echo-b", "echo-c"), calls(3, 5000));
        fleet.hang("echo-c");
        assertEquals(List.of("echo-a", "echo-b", "DEADLINE_EXCEEDED", "echo-a", "echo-b", "DEADLINE_EXCEEDED"), calls(6, 200));
        assertTrue(leases.stream().allMatch(l -> l.getExcludeCount() == 0), "an exclude before any hold: " + leases);

        // The third in a row: echo-c is held out.
        long heldFrom = fleet.received.size();
        assertEquals(List.of("echo-a", "echo-b", "DEADLINE_EXCEEDED"), calls(3, 200));
        int leasedBefore = leases.size();
        List<String> after = calls(24, 5000);
        Map<String, Integer> counts = new TreeMap<>();
        after.forEach(id -> counts.merge(id, 1, Integer::sum));
        assertEquals(Map.of("echo-a", 12, "echo-b", 12), counts, after.toString());
        // echo-c's tickets (t mod 3 = 2 here) are passed over, gaps; the RPC takes the next ticket.
        List<EchoFleet.Received> received = List.copyOf(fleet.received).subList((int) heldFrom + 3, fleet.received.size());
        long previous = Long.parseLong(received.get(0).ticket()) - 1;
        for (EchoFleet.Received r : received) {
            long ticket = Long.parseLong(r.ticket());
            assertEquals(List.of("echo-a", "echo-b", "echo-c").get((int) (ticket % 3)), r.instance(), "ticket " + ticket);
            for (long skipped = previous + 1; skipped < ticket; skipped++) {
                assertEquals(2, skipped % 3, "ticket " + skipped + " of a usable instance was passed over");
            }
            previous = ticket;
        }
        // The leases asked while echo-c is held out tell rota so.
        List<LeaseRequest> held = List.copyOf(leases).subList(leasedBefore, leases.size());
        assertTrue(!held.isEmpty(), "no lease while echo-c was held out");
        assertTrue(held.stream().allMatch(l -> l.getExcludeList().equals(List.of("echo-c"))), held.toString());
    }

    private final class Balancer extends BalancerGrpc.BalancerImplBase {
        @Override
        public void lease(LeaseRequest request, StreamObserver<LeaseResponse> response) {
            long first = tickets.getAndAdd(request.getCount());
            leases.add(request);
            // Positions t mod 3 over the three, whatever the request excludes: so that the test
            // sees the channel pass over the tickets of an instance it holds out.
            response.onNext(FakeLease.range(instances, first, request.getCount(), "round_robin", t -> (int) (t % 3)).build());
            response.onCompleted();
        }

        @Override
        public void report(ReportRequest request, StreamObserver<ReportResponse> response) {
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
