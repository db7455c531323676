package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.rota.client.Backoff;
import io.rota.client.Instance;
import io.rota.client.RotaClient;
import io.rota.client.RotaCredentials;
import io.rota.client.RotaException;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.TestCertificates;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * The client and the rota:/// channel against a rota with tokens and TLS, and with mTLS: picks
 * and routed RPCs work with the right settings, from the builder or from the environment, and a
 * wrong token fails with rota's own message.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class SecuredRotaTest {
    private static final String TOKEN = "java-suite-token-0123456789";
    private static final List<String> IDS = List.of("echo-a", "echo-b");
    private static TestCertificates certs;

    private RotaServer rota;
    private EchoFleet fleet;
    private final List<AutoCloseable> open = new ArrayList<>();

    @BeforeAll
    static void makeCertificates() throws Exception {
        certs = TestCertificates.create("rota-java-test-ca");
    }

    @AfterEach
    void stop() throws Exception {
        for (int i = open.size() - 1; i >= 0; i--) {
            open.get(i).close();
        }
        if (fleet != null) {
            fleet.close();
        }
        if (rota != null) {
            rota.close();
        }
    }

    /**
     * The arguments of a {@code rota serve} with one token (every scope) and TLS, with
     * {@code mutual} client certificates of the test CA; its config file goes next to the certificates.
     */
    static List<String> securedServeArgs(TestCertificates certs, String token, boolean mutual) throws Exception {
        Path tokenFile = certs.dir.resolve("token");
        Files.writeString(tokenFile, token + "\n");
        Path config = certs.dir.resolve("rota.toml");
        Files.writeString(config, "[[auth.tokens]]\nname = \"java-suite\"\ntoken_file = \"" + tokenFile
                + "\"\nscopes = [\"pick\", \"register:*\", \"admin\"]\n");
        List<String> args = new ArrayList<>(List.of("--config", config.toString(), "--tls-cert",
                certs.serverCert.toString(), "--tls-key", certs.serverKey.toString()));
        if (mutual) {
            args.addAll(List.of("--tls-client-ca", certs.ca.toString()));
        }
        return args;
    }

    private void serve(boolean mutual) throws Exception {
        List<String> args = securedServeArgs(certs, TOKEN, mutual);
        rota = RotaServer.start(args.toArray(String[]::new));
        fleet = new EchoFleet();
        RotaClient provider = client(settings(TOKEN, mutual), name -> null);
        List<Instance> instances = new ArrayList<>();
        for (String id : IDS) {
            instances.add(Instance.of("echo", "127.0.0.1", fleet.start(id)).withId(id));
        }
        open.add(provider.register(instances));
    }

    private String server() {
        return "https://localhost:" + rota.port();
    }

    private static RotaCredentials settings(String token, boolean withCertificate) {
        RotaCredentials.Builder builder = RotaCredentials.builder().token(token).tlsCa(certs.ca);
        if (withCertificate) {
            builder.tlsClientCertificate(certs.clientCert, certs.clientKey);
        }
        return builder.build();
    }

    private RotaClient client(RotaCredentials credentials, java.util.function.Function<String, String> environment) {
        RotaClient client = RotaClient.builder().target(server()).credentials(credentials).environment(environment)
                .backoff(Backoff.exponential(Duration.ofMillis(20), Duration.ofMillis(200))).build();
        open.add(client);
        return client;
    }

    /** A rota:/// channel for "echo", resolved with {@code environment} as the process environment. */
    @SuppressWarnings("deprecation") // the one way to give a channel a resolver provider of its own
    private EchoGrpc.EchoBlockingStub channel(RotaCredentials credentials, Map<String, String> environment) {
        ManagedChannelBuilder<?> builder = NettyChannelBuilder.forTarget("rota:///echo", InsecureChannelCredentials.create())
                .nameResolverFactory(new RotaNameResolverProvider(environment::get))
                .setNameResolverArg(RotaChannels.SERVER, server());
        if (credentials != null) {
            builder.setNameResolverArg(RotaChannels.CREDENTIALS, credentials);
        }
        ManagedChannel channel = builder.build();
        open.add(() -> channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS));
        return EchoGrpc.newBlockingStub(channel);
    }

    /** The instances that answered {@code count} RPCs of {@code stub}. */
    private static Set<String> answered(EchoGrpc.EchoBlockingStub stub, int count) {
        Set<String> ids = new TreeSet<>();
        for (int i = 0; i < count; i++) {
            ids.add(stub.withDeadlineAfter(20, TimeUnit.SECONDS)
                    .echo(EchoRequest.newBuilder().setMessage("rpc " + i).build()).getInstanceId());
        }
        return ids;
    }

    @Test
    void tokenAndTlsFromTheBuilderRouteThePicksAndTheChannel() throws Exception {
        serve(false);
        RotaClient consumer = client(settings(TOKEN, false), name -> null);
        assertTrue(IDS.contains(consumer.pick("echo").id()));
        assertEquals(Set.copyOf(IDS), Set.copyOf(answered(channel(settings(TOKEN, false), Map.of()), 10)));
    }

    @Test
    void mutualTlsNeedsTheClientCertificate() throws Exception {
        serve(true);
        assertTrue(IDS.contains(client(settings(TOKEN, true), name -> null).pick("echo").id()));
        assertEquals(Set.copyOf(IDS), Set.copyOf(answered(channel(settings(TOKEN, true), Map.of()), 10)));

        RotaException refused = assertThrows(RotaException.class,
                () -> client(settings(TOKEN, false), name -> null).pick("echo"));
        assertEquals(Status.Code.UNAVAILABLE, refused.getCode(), refused.getMessage());
    }

    @Test
    void aWrongTokenFailsWithRotasMessage() throws Exception {
        serve(false);
        RotaException refused = assertThrows(RotaException.class,
                () -> client(settings("not-the-token-0123456789", false), name -> null).pick("echo"));
        assertEquals(Status.Code.UNAUTHENTICATED, refused.getCode());
        assertTrue(refused.getMessage().contains("the token is not valid"), refused.getMessage());

        StatusRuntimeException failed = assertThrows(StatusRuntimeException.class,
                () -> answered(channel(settings("not-the-token-0123456789", false), Map.of()), 1));
        assertEquals(Status.Code.UNAVAILABLE, failed.getStatus().getCode());
        assertTrue(failed.getStatus().getDescription().contains("UNAUTHENTICATED: the token is not valid"),
                failed.getStatus().getDescription());
    }

    @Test
    void theEnvironmentGivesWhatTheBuilderLeavesOut() throws Exception {
        serve(true);
        Map<String, String> environment = Map.of(RotaCredentials.TOKEN_ENV, TOKEN,
                RotaCredentials.TLS_CA_ENV, certs.ca.toString(), RotaCredentials.TLS_CERT_ENV,
                certs.clientCert.toString(), RotaCredentials.TLS_KEY_ENV, certs.clientKey.toString());
        assertTrue(IDS.contains(client(RotaCredentials.none(), environment::get).pick("echo").id()));
        assertEquals(Set.copyOf(IDS), Set.copyOf(answered(channel(null, environment), 10)));

        // An explicit token wins over the environment's.
        RotaCredentials wrongToken = RotaCredentials.builder().token("not-the-token-0123456789").build();
        RotaException refused = assertThrows(RotaException.class,
                () -> client(wrongToken, environment::get).pick("echo"));
        assertEquals(Status.Code.UNAUTHENTICATED, refused.getCode());
    }
}
