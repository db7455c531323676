package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import io.grpc.Server;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.client.testing.Await;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.CallOutcome;
import io.rota.v1.CallResult;
import io.rota.v1.ReportRequest;
import io.rota.v1.ReportResponse;

/** The channel's outcome buffer against a recording stand-in for rota's Report. */
class ReportBufferTest {
    private final List<ReportRequest> reports = new CopyOnWriteArrayList<>();
    private final AtomicBoolean down = new AtomicBoolean();
    private final AtomicInteger failed = new AtomicInteger();
    private Server rota;

    @BeforeEach
    void start() throws Exception {
        rota = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(new BalancerGrpc.BalancerImplBase() {
                    @Override
                    public void report(ReportRequest request, StreamObserver<ReportResponse> response) {
                        if (down.get()) {
                            failed.incrementAndGet();
                            response.onError(Status.UNAVAILABLE.withDescription("down").asRuntimeException());
                            return;
                        }
                        reports.add(request);
                        response.onNext(ReportResponse.newBuilder().setAccepted(request.getOutcomesCount()).build());
                        response.onCompleted();
                    }
                }).build().start();
    }

    @AfterEach
    void stop() {
        rota.shutdownNow();
    }

    private static RotaLink.Outcome outcome(long ticket) {
        return new RotaLink.Outcome("a", ticket, "round_robin", 10, CallResult.CALL_RESULT_OK);
    }

    private List<CallOutcome> reported() {
        return reports.stream().flatMap(r -> r.getOutcomesList().stream()).toList();
    }

    @Test
    void aFullBatchGoesOutWithoutWaitingForTheInterval() throws Exception {
        try (RotaLink link = new RotaLink("127.0.0.1:" + rota.getPort(), "echo", Duration.ofHours(1).toMillis())) {
            for (long i = 0; i < RotaLink.REPORT_BATCH; i++) {
                link.report(outcome(i));
            }
            Await.until("a Report of the full batch", Duration.ofSeconds(10), () -> reports.size() == 1);
            List<CallOutcome> sent = reported();
            assertEquals(RotaLink.REPORT_BATCH, sent.size());
            for (int i = 0; i < sent.size(); i++) {
                CallOutcome o = sent.get(i);
                assertEquals(i, o.getTicket());
                assertTrue(o.getLeased() && o.getService().equals("echo") && o.getInstanceId().equals("a"), o.toString());
            }
        }
    }

    @Test
    void theNewestOutcomesWaitWhileRotaIsAwayAndTheOldestAreDroppedAndCounted() throws Exception {
        down.set(true);
        int extra = 1500;
        try (RotaLink link = new RotaLink("127.0.0.1:" + rota.getPort(), "echo", 20)) {
            // Every Report fails meanwhile; a batch a flush holds out still counts against the bound.
            for (long i = 0; i < RotaLink.REPORT_BACKLOG + extra; i++) {
                link.report(outcome(i));
            }
            // Two more failures: a batch out when the loop ended has come back (and its excess
            // was dropped) before the next one was sent.
            int before = failed.get();
            Await.until("failed Reports", Duration.ofSeconds(10), () -> failed.get() >= before + 2);
            down.set(false);
            Await.until("the held outcomes reported", Duration.ofSeconds(20),
                    () -> reported().size() >= RotaLink.REPORT_BACKLOG);
            assertEquals(extra, link.droppedOutcomes());
            List<CallOutcome> sent = reported();
            assertEquals(RotaLink.REPORT_BACKLOG, sent.size());
            for (int i = 0; i < sent.size(); i++) {
                assertEquals(extra + i, sent.get(i).getTicket(), "oldest dropped, order kept");
            }
            assertTrue(reports.stream().allMatch(r -> r.getOutcomesCount() <= RotaLink.REPORT_BATCH));
        }
    }
}
