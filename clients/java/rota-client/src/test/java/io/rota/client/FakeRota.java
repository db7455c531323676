package io.rota.client;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerInterceptors;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.InstanceList;
import io.rota.v1.PickRequest;
import io.rota.v1.PickResponse;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.ReportRequest;
import io.rota.v1.ReportResponse;
import io.rota.v1.WatchEvent;
import io.rota.v1.WatchRequest;

/**
 * A scripted stand-in for rota on a loopback port (real HTTP/2 transport), for tests of the
 * client's own logic: it records requests and answers picks with a function the test sets.
 */
final class FakeRota implements AutoCloseable {
    final List<PickRequest> picks = new CopyOnWriteArrayList<>();
    final List<ReportRequest> reports = new CopyOnWriteArrayList<>();
    volatile Function<PickRequest, PickResponse> onPick = request -> {
        throw Status.NOT_FOUND.withDescription("no service " + request.getService()).asRuntimeException();
    };
    volatile List<Instance> watched = List.of();
    /** Whether a watch ends right after its snapshot, as a draining server's would. */
    volatile boolean endWatchesAfterSnapshot;
    final List<StreamObserver<WatchEvent>> watches = new CopyOnWriteArrayList<>();
    private final Server server;

    FakeRota(io.grpc.ServerInterceptor... interceptors) throws IOException {
        server = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(ServerInterceptors.intercept(new Balancer(), interceptors))
                .addService(new Registry())
                .build()
                .start();
    }

    String target() {
        return "127.0.0.1:" + server.getPort();
    }

    /** A failure as rota answers it: a status with the {@code rota-error} trailer. */
    static StatusRuntimeException refusal(Status status, String reason) {
        Metadata trailers = new Metadata();
        trailers.put(RotaException.REASON_KEY, reason);
        return status.asRuntimeException(trailers);
    }

    /** Sends {@code event} on every open watch. */
    void push(WatchEvent event) {
        for (StreamObserver<WatchEvent> watch : watches) {
            synchronized (watch) {
                watch.onNext(event);
            }
        }
    }

    static PickResponse answer(Instance instance, long ticket) {
        return PickResponse.newBuilder().setInstance(Wire.instance(instance)).setTicket(ticket).setRule("round_robin")
                .setEpoch(1).build();
    }

    @Override
    public void close() {
        server.shutdownNow();
        try {
            server.awaitTermination(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private final class Balancer extends BalancerGrpc.BalancerImplBase {
        @Override
        public void pick(PickRequest request, StreamObserver<PickResponse> response) {
            picks.add(request);
            PickResponse answer;
            try {
                answer = onPick.apply(request);
            } catch (StatusRuntimeException e) {
                response.onError(e);
                return;
            }
            if (answer != null) {
                response.onNext(answer);
                response.onCompleted();
            }
            // null: never answer (the caller's deadline expires)
        }

        @Override
        public void report(ReportRequest request, StreamObserver<ReportResponse> response) {
            reports.add(request);
            response.onNext(ReportResponse.newBuilder().setAccepted(request.getOutcomesCount()).build());
            response.onCompleted();
        }
    }

    private final class Registry extends RegistryGrpc.RegistryImplBase {
        @Override
        public void watch(WatchRequest request, StreamObserver<WatchEvent> response) {
            WatchEvent snapshot = WatchEvent.newBuilder()
                    .setSnapshot(InstanceList.newBuilder().addAllInstances(Wire.instances(watched)))
                    .setEpoch(4)
                    .build();
            if (endWatchesAfterSnapshot) {
                response.onNext(snapshot);
                response.onError(Status.UNAVAILABLE.withDescription("shutting down").asRuntimeException());
                return;
            }
            // Stays open, like rota's; listed before its snapshot goes out, so that once a client
            // has seen the snapshot, push() reaches it.
            synchronized (response) {
                watches.add(response);
                response.onNext(snapshot);
            }
        }
    }
}
