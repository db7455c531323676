package io.rota.client.channel;

import java.util.ArrayList;
import java.util.List;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.rota.client.Instance;
import io.rota.client.RotaClient;
import io.rota.client.RotaCredentials;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.TestCertificates;

/**
 * Throughput and p99 of unary echo RPCs through a {@code rota:///echo} channel whose rota takes a
 * token over TLS, against one whose rota is plaintext without tokens, over the same three echo
 * servers, in alternating rounds of one run. The providers are reached in plaintext either way:
 * what differs is the channel's link to rota (Watch, Lease, Report). Prints the figures; asserts
 * nothing.
 *
 * <pre>
 * cd clients/java && mvn -q -o -pl rota-client test-compile dependency:build-classpath \
 *     -Dmdep.outputFile=target/bench-cp.txt -Dmdep.includeScope=test
 * java -cp rota-client/target/test-classes:rota-client/target/classes:$(cat rota-client/target/bench-cp.txt) \
 *     -Drota.bin=$ROTA_BIN io.rota.client.channel.SecuredChannelBench [rounds] [seconds] [callers]
 * </pre>
 */
public final class SecuredChannelBench {
    private static final String TOKEN = "bench-token-0123456789";

    private SecuredChannelBench() {
    }

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 4;
        int seconds = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        int callers = args.length > 2 ? Integer.parseInt(args[2]) : 4;
        TestCertificates certs = TestCertificates.create("rota-bench-ca");
        RotaCredentials credentials = RotaCredentials.builder().token(TOKEN).tlsCa(certs.ca).build();
        try (RotaServer plain = RotaServer.start();
                RotaServer secured = RotaServer.start(SecuredRotaTest.securedServeArgs(certs, TOKEN, false)
                        .toArray(String[]::new));
                EchoFleet fleet = new EchoFleet();
                RotaClient plainProvider = RotaClient.builder().target(plain.target()).build();
                RotaClient securedProvider = RotaClient.builder().target("https://localhost:" + secured.port())
                        .credentials(credentials).build()) {
            List<Instance> instances = new ArrayList<>();
            for (String id : List.of("echo-a", "echo-b", "echo-c")) {
                instances.add(Instance.of("echo", "127.0.0.1", fleet.start(id)).withId(id));
            }
            plainProvider.register(instances);
            securedProvider.register(instances);
            ManagedChannel viaPlain = ManagedChannelBuilder.forTarget("rota://" + plain.target() + "/echo")
                    .usePlaintext().build();
            ManagedChannel viaSecured = ManagedChannelBuilder.forTarget("rota:///echo")
                    .setNameResolverArg(RotaChannels.SERVER, "https://localhost:" + secured.port())
                    .setNameResolverArg(RotaChannels.CREDENTIALS, credentials)
                    .usePlaintext().build();
            ChannelBench.run(viaSecured, seconds, callers); // warm-up (JIT, connections)
            ChannelBench.run(viaPlain, seconds, callers);
            System.out.printf("%d callers, %d rounds of %d s each, alternating%n", callers, rounds, seconds);
            for (int round = 1; round <= rounds; round++) {
                boolean securedFirst = round % 2 == 1;
                ChannelBench.Result first = ChannelBench.run(securedFirst ? viaSecured : viaPlain, seconds, callers);
                ChannelBench.Result second = ChannelBench.run(securedFirst ? viaPlain : viaSecured, seconds, callers);
                ChannelBench.Result tls = securedFirst ? first : second;
                ChannelBench.Result plaintext = securedFirst ? second : first;
                System.out.printf("round %d  token+TLS %8.0f rpc/s p99 %6.0f us  plaintext %8.0f rpc/s p99 %6.0f us  ratio %.2f%n",
                        round, tls.rpcs() / (double) seconds, tls.p99Us(), plaintext.rpcs() / (double) seconds,
                        plaintext.p99Us(), tls.rpcs() / (double) plaintext.rpcs());
            }
            viaPlain.shutdownNow();
            viaSecured.shutdownNow();
        }
    }
}
