package io.rota.client.channel;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * A second consumer process for the channel scenarios: N unary Echo calls through its own
 * rota:/// channel; prints one line per failed call ({@code FAILED <message>}), then {@code DONE}.
 *
 * <pre>java EchoConsumer TARGET RULE CALLS VERSION DEADLINE_MS</pre>
 */
public final class EchoConsumer {
    private EchoConsumer() {
    }

    public static void main(String[] args) throws InterruptedException {
        String target = args[0];
        String rule = args[1];
        int calls = Integer.parseInt(args[2]);
        String version = args.length > 3 ? args[3] : "";
        long deadlineMs = args.length > 4 ? Long.parseLong(args[4]) : 5000;
        ManagedChannel channel = ManagedChannelBuilder.forTarget(target)
                .setNameResolverArg(RotaChannels.RULE, rule)
                .setNameResolverArg(RotaChannels.TICKET_HEADER_ENABLED, true)
                .usePlaintext().build();
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
        if (!version.isEmpty()) {
            Metadata headers = new Metadata();
            headers.put(RotaChannels.VERSION_KEY, version);
            stub = stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
        }
        List<String> failures = new ArrayList<>();
        for (int i = 0; i < calls; i++) {
            try {
                stub.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS).echo(EchoRequest.newBuilder().setMessage("second " + i).build());
            } catch (StatusRuntimeException e) {
                failures.add(String.valueOf(e.getStatus().getDescription()).replace('\n', ' '));
            }
        }
        for (String failure : failures) {
            System.out.println("FAILED " + failure);
        }
        System.out.println("DONE");
        channel.shutdownNow();
        channel.awaitTermination(5, TimeUnit.SECONDS);
    }
}
