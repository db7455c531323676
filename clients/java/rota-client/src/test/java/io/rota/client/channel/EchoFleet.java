package io.rota.client.channel;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;

import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.stub.StreamObserver;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoReply;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/** Echo servers on loopback ports, each answering with its id, recording every RPC it receives. */
final class EchoFleet implements AutoCloseable {
    /** One RPC as an echo server saw it. */
    record Received(String instance, String ticket, long nanos) {
    }

    final ConcurrentLinkedQueue<Received> received = new ConcurrentLinkedQueue<>();
    final Map<String, Server> servers = new ConcurrentHashMap<>();

    /** Starts an echo server answering as {@code id}; returns its port. */
    int start(String id) throws IOException {
        ServerInterceptor recorder = new ServerInterceptor() {
            @Override
            public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
                received.add(new Received(id, headers.get(RotaChannels.TICKET_KEY), System.nanoTime()));
                return next.startCall(call, headers);
            }
        };
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(ServerInterceptors.intercept(new Echo(id), recorder))
                .build()
                .start();
        servers.put(id, server);
        return server.getPort();
    }

    /** Stops one server at once: its port refuses connections from now on. */
    void kill(String id) throws InterruptedException {
        Server server = servers.remove(id);
        server.shutdownNow();
        server.awaitTermination(10, TimeUnit.SECONDS);
    }

    List<Received> since(long nanos) {
        List<Received> out = new ArrayList<>();
        for (Received r : received) {
            if (r.nanos() - nanos >= 0) {
                out.add(r);
            }
        }
        return out;
    }

    @Override
    public void close() throws InterruptedException {
        for (Server server : servers.values()) {
            server.shutdownNow();
        }
        for (Server server : servers.values()) {
            server.awaitTermination(10, TimeUnit.SECONDS);
        }
    }

    private static final class Echo extends EchoGrpc.EchoImplBase {
        private final String id;

        Echo(String id) {
            this.id = id;
        }

        @Override
        public void echo(EchoRequest request, StreamObserver<EchoReply> responses) {
            responses.onNext(EchoReply.newBuilder().setInstanceId(id).setMessage(request.getMessage()).build());
            responses.onCompleted();
        }

        @Override
        public StreamObserver<EchoRequest> echoStream(StreamObserver<EchoReply> responses) {
            return new StreamObserver<>() {
                @Override
                public void onNext(EchoRequest request) {
                    responses.onNext(EchoReply.newBuilder().setInstanceId(id).setMessage(request.getMessage()).build());
                }

                @Override
                public void onError(Throwable t) {
                    // the caller went away
                }

                @Override
                public void onCompleted() {
                    responses.onCompleted();
                }
            };
        }
    }
}
