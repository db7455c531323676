package io.rota.xds;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.logging.ConsoleHandler;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;

import io.grpc.ConnectivityState;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.MetadataUtils;
import io.rota.client.channel.RotaChannels;
import io.rota.client.channel.XdsPolicyOptions;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoReply;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * The consumer of an xDS scenario: a process of its own (grpc-java keeps one xDS client, and one
 * bootstrap, per process), with a channel to {@code xds:///SERVICE} built by grpc-xds from the
 * bootstrap named by {@code GRPC_XDS_BOOTSTRAP}. It reads commands from standard input, one a line,
 * and answers on standard output:
 *
 * <ul>
 *   <li>at start: {@code READY READY} once the channel is READY; {@code READY IDLE} once it is
 *       IDLE again after it left IDLE (its resources came and its policy connects on the first
 *       call, as {@code ring_hash} does); else {@code READY STATE} with the state it is in after
 *       {@value #READY_SECONDS} s (then the calls will tell why);</li>
 *   <li>{@code calls N DEADLINE_MS KEYS [VERSION]}: N unary {@code Echo} calls, one after another,
 *       call i with {@code x-rota-key: key-(i mod KEYS)} when KEYS is above 0;</li>
 *   <li>{@code streak WANT MAX DEADLINE_MS [VERSION]}: calls until WANT calls in a row succeeded,
 *       at most MAX calls;</li>
 *   <li>{@code quit}: closes the channel and exits.</li>
 * </ul>
 *
 * <p>Each call answers {@code OK INSTANCE} or {@code FAILED CODE DESCRIPTION}; each command ends
 * with {@code DONE N}. {@code VERSION} is sent as {@code x-rota-version} metadata. grpc-xds logs
 * (logger {@code io.grpc.xds}, at FINER: its xDS INFO and WARNING lines, NACKs among them; at
 * FINEST with {@code -Drota.xds.debug=true}: every resource received) go to standard error.
 *
 * <p>With {@code -D}{@value #ROTA_POLICY_PROPERTY}{@code =HOST:PORT} it first registers rota's own
 * load-balancing policy ({@code RotaChannels.registerXdsPolicy}, gRFC A52) leasing from that rota,
 * with the {@code x-rota-ticket} header on, so that rota's clusters route by its central rotation.
 */
public final class XdsConsumer {
    static final int READY_SECONDS = 20;
    /** The system property naming rota's address for rota's own xDS policy. */
    static final String ROTA_POLICY_PROPERTY = "rota.xds.policy";
    /** The header rota's xDS routes hash under {@code consistent_hash} and {@code sticky} (the {@code ring_hash} policy). */
    static final Metadata.Key<String> KEY_HEADER = Metadata.Key.of("x-rota-key", Metadata.ASCII_STRING_MARSHALLER);

    /** Held so that the configured loggers are not collected (and reset) while the process runs. */
    private static final Logger XDS_LOG = Logger.getLogger("io.grpc.xds");
    private static final Logger GRPC_LOG = Logger.getLogger("io.grpc");

    private XdsConsumer() {
    }

    public static void main(String[] args) throws Exception {
        String target = args[0];
        configureLogging(Boolean.getBoolean("rota.xds.debug") ? Level.FINEST : Level.FINER);
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        String rota = System.getProperty(ROTA_POLICY_PROPERTY);
        if (rota != null) {
            // Before the channel: grpc-xds looks the policy up when it parses the clusters.
            RotaChannels.registerXdsPolicy(rota, XdsPolicyOptions.defaults().withTicketHeader(true));
        }
        ManagedChannel channel = Grpc.newChannelBuilder(target, InsecureChannelCredentials.create()).build();
        try {
            out.println("READY " + awaitReady(channel));
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                String[] words = line.trim().split(" ");
                switch (words[0]) {
                    case "calls" -> {
                        int n = Integer.parseInt(words[1]);
                        long deadlineMs = Long.parseLong(words[2]);
                        int keys = Integer.parseInt(words[3]);
                        String version = words.length > 4 ? words[4] : "";
                        for (int i = 0; i < n; i++) {
                            out.println(call(channel, version, keyName(i, keys), deadlineMs));
                        }
                        out.println("DONE " + n);
                    }
                    case "streak" -> {
                        int want = Integer.parseInt(words[1]);
                        int max = Integer.parseInt(words[2]);
                        long deadlineMs = Long.parseLong(words[3]);
                        String version = words.length > 4 ? words[4] : "";
                        int made = 0;
                        for (int inARow = 0; made < max && inARow < want; made++) {
                            String answer = call(channel, version, null, deadlineMs);
                            out.println(answer);
                            inARow = answer.startsWith("OK ") ? inARow + 1 : 0;
                        }
                        out.println("DONE " + made);
                    }
                    case "quit" -> {
                        return;
                    }
                    default -> out.println("UNKNOWN " + line);
                }
            }
        } finally {
            channel.shutdownNow();
            channel.awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /**
     * Waits (bounded) for the channel to be READY, or IDLE after it left IDLE (a policy that
     * connects only for a call, as {@code ring_hash}, goes back to IDLE once its resources came);
     * returns the state it is in then.
     */
    private static ConnectivityState awaitReady(ManagedChannel channel) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(READY_SECONDS);
        ConnectivityState state = channel.getState(true);
        boolean leftIdle = state != ConnectivityState.IDLE;
        while (state != ConnectivityState.READY && !(leftIdle && state == ConnectivityState.IDLE)) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return state;
            }
            CountDownLatch changed = new CountDownLatch(1);
            channel.notifyWhenStateChanged(state, changed::countDown);
            if (!changed.await(left, TimeUnit.NANOSECONDS)) {
                return channel.getState(false);
            }
            state = channel.getState(false);
            leftIdle |= state != ConnectivityState.IDLE;
        }
        return state;
    }

    /** The {@code x-rota-key} of call {@code i} of a batch with {@code keys} keys: {@code key-(i mod keys)}, or null for none. */
    static String keyName(int i, int keys) {
        return keys > 0 ? "key-" + (i % keys) : null;
    }

    /** One call; {@code key}, when not null, goes in its {@code x-rota-key} metadata. */
    private static String call(ManagedChannel channel, String version, String key, long deadlineMs) {
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
        Metadata headers = new Metadata();
        if (!version.isEmpty()) {
            headers.put(Metadata.Key.of(RotaChannels.VERSION_HEADER, Metadata.ASCII_STRING_MARSHALLER), version);
        }
        if (key != null) {
            headers.put(KEY_HEADER, key);
        }
        if (headers.keys().size() > 0) {
            stub = stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers));
        }
        try {
            EchoReply reply = stub.withDeadlineAfter(deadlineMs, TimeUnit.MILLISECONDS)
                    .echo(EchoRequest.newBuilder().setMessage("xds").build());
            return "OK " + reply.getInstanceId();
        } catch (StatusRuntimeException e) {
            String description = String.valueOf(e.getStatus().getDescription()).replace('\n', ' ');
            return "FAILED " + e.getStatus().getCode() + " " + description;
        }
    }

    private static void configureLogging(Level xds) {
        ConsoleHandler handler = new ConsoleHandler();
        handler.setLevel(Level.ALL);
        System.setProperty("java.util.logging.SimpleFormatter.format", "%1$tT.%1$tL %4$s %3$s: %5$s%6$s%n");
        handler.setFormatter(new SimpleFormatter());
        GRPC_LOG.setLevel(Level.INFO);
        XDS_LOG.setLevel(xds);
        XDS_LOG.addHandler(handler);
        XDS_LOG.setUseParentHandlers(false);
    }
}
