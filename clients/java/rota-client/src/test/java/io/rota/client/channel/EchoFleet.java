package io.rota.client.channel;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
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

/**
 * Echo servers on loopback ports, each answering with its id, recording every RPC it receives;
 * a server can be made to hang (keep its connections, answer nothing) until the fleet closes.
 * Public for the xDS conformance runner (rota-xds-conformance), which uses this test-jar.
 */
public final class EchoFleet implements AutoCloseable {
    /** One RPC as an echo server saw it; {@code hung}: the server had hung, and left it unanswered. */
    public record Received(String instance, String ticket, long nanos, boolean hung) {
    }

    public final ConcurrentLinkedQueue<Received> received = new ConcurrentLinkedQueue<>();
    final Map<String, Server> servers = new ConcurrentHashMap<>();
    /** Ids of the servers that hang. */
    private final Set<String> hung = ConcurrentHashMap.newKeySet();
    /** Calls a hung server holds; answered with UNAVAILABLE when the fleet closes. */
    private final ConcurrentLinkedQueue<StreamObserver<?>> held = new ConcurrentLinkedQueue<>();

    /** Starts an echo server answering as {@code id}; returns its port. */
    public int start(String id) throws IOException {
        ServerInterceptor recorder = new ServerInterceptor() {
            @Override
            public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
                received.add(new Received(id, headers.get(RotaChannels.TICKET_KEY), System.nanoTime(), hung.contains(id)));
                return next.startCall(call, headers);
            }
        };
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0))
                .addService(ServerInterceptors.intercept(new Echo(id, hung, held), recorder))
                .build()
                .start();
        servers.put(id, server);
        return server.getPort();
    }

    /**
     * A loopback port where nothing listens: bound, noted and closed (connections to it are
     * refused).
     */
    public static int unreachablePort() throws IOException {
        try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            return socket.getLocalPort();
        }
    }

    /**
     * Makes one server hang, as a stopped process would: its connections stay open and every
     * call it receives from now on waits, unanswered, until the fleet closes.
     */
    public void hang(String id) {
        hung.add(id);
    }

    /** A hung server answers the calls it receives from now on (those it holds stay unanswered). */
    public void resume(String id) {
        hung.remove(id);
    }

    /** Stops one server at once: its port refuses connections from now on. */
    public void kill(String id) throws InterruptedException {
        Server server = servers.remove(id);
        server.shutdownNow();
        server.awaitTermination(10, TimeUnit.SECONDS);
    }

    public List<Received> since(long nanos) {
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
        hung.clear();
        StreamObserver<?> call;
        while ((call = held.poll()) != null) {
            try {
                call.onError(io.grpc.Status.UNAVAILABLE.withDescription("the echo server stops").asRuntimeException());
            } catch (RuntimeException gone) {
                // the caller gave up on it long ago
            }
        }
        for (Server server : servers.values()) {
            server.shutdownNow();
        }
        for (Server server : servers.values()) {
            server.awaitTermination(10, TimeUnit.SECONDS);
        }
    }

    private static final class Echo extends EchoGrpc.EchoImplBase {
        private final String id;
        private final Set<String> hung;
        private final ConcurrentLinkedQueue<StreamObserver<?>> held;

        Echo(String id, Set<String> hung, ConcurrentLinkedQueue<StreamObserver<?>> held) {
            this.id = id;
            this.hung = hung;
            this.held = held;
        }

        @Override
        public void echo(EchoRequest request, StreamObserver<EchoReply> responses) {
            if (hung.contains(id)) {
                // No thread waits: the call stays open until the caller gives up or the fleet closes.
                held.add(responses);
                return;
            }
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
