package io.rota.client.channel;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.URI;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import io.grpc.EquivalentAddressGroup;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.NameResolver;
import io.grpc.NameResolverProvider;
import io.grpc.NameResolverRegistry;
import io.grpc.StatusOr;
import io.rota.client.Instance;
import io.rota.client.RotaClient;
import io.rota.client.testing.RotaServer;
import rota.echo.v1.EchoGrpc;
import rota.echo.v1.EchoOuterClass.EchoRequest;

/**
 * Throughput and p99 of unary echo RPCs through a {@code rota:///echo} channel against grpc's own
 * {@code round_robin} over the same three echo servers, in alternating rounds of one run, and
 * the RPCs per {@code Lease} call. Prints the figures; asserts nothing.
 *
 * <pre>
 * cd clients/java && mvn -q -o -pl rota-client test-compile dependency:build-classpath \
 *     -Dmdep.outputFile=target/bench-cp.txt -Dmdep.includeScope=test
 * java -cp rota-client/target/test-classes:rota-client/target/classes:$(cat rota-client/target/bench-cp.txt) \
 *     -Drota.bin=$ROTA_BIN io.rota.client.channel.ChannelBench [rounds] [seconds] [callers]
 * </pre>
 */
public final class ChannelBench {
    private ChannelBench() {
    }

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 3;
        int seconds = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        int callers = args.length > 2 ? Integer.parseInt(args[2]) : 4;
        try (RotaServer rota = RotaServer.start(); EchoFleet fleet = new EchoFleet();
                RotaClient provider = RotaClient.builder().target(rota.target()).build()) {
            List<InetSocketAddress> addresses = new ArrayList<>();
            List<Instance> instances = new ArrayList<>();
            for (String id : List.of("echo-a", "echo-b", "echo-c")) {
                int port = fleet.start(id);
                addresses.add(new InetSocketAddress("127.0.0.1", port));
                instances.add(Instance.of("echo", "127.0.0.1", port).withId(id));
            }
            provider.register(instances);
            NameResolverRegistry.getDefaultRegistry().register(new StaticResolver(addresses));
            ManagedChannel viaRota = ManagedChannelBuilder.forTarget("rota://" + rota.target() + "/echo")
                    .usePlaintext().build();
            ManagedChannel viaRoundRobin = ManagedChannelBuilder.forTarget("bench-static:///echo")
                    .defaultLoadBalancingPolicy("round_robin").usePlaintext().build();
            run(viaRota, seconds, callers);  // warm-up (JIT, connections)
            run(viaRoundRobin, seconds, callers);
            long rpcsViaRota = 0;
            long leasesBefore = RotaLink.LEASE_CALLS.get();
            System.out.printf("%d callers, %d rounds of %d s each, alternating%n", callers, rounds, seconds);
            for (int round = 1; round <= rounds; round++) {
                // The order alternates too, so that neither channel always runs first while the JVM warms up.
                boolean rotaFirst = round % 2 == 1;
                for (boolean rotaRound : new boolean[] {rotaFirst, !rotaFirst}) {
                    Result r = run(rotaRound ? viaRota : viaRoundRobin, seconds, callers);
                    if (rotaRound) {
                        rpcsViaRota += r.rpcs;
                    }
                    System.out.printf("round %d %-12s %8.0f rpc/s  p50 %6.0f us  p99 %6.0f us%n", round,
                            rotaRound ? "rota:///" : "round_robin", r.rpcs / (double) seconds, r.p50Us, r.p99Us);
                }
            }
            long leases = RotaLink.LEASE_CALLS.get() - leasesBefore;
            System.out.printf("rota:/// RPCs per Lease call: %.0f (%d RPCs, %d leases)%n",
                    rpcsViaRota / (double) Math.max(1, leases), rpcsViaRota, leases);
            viaRota.shutdownNow();
            viaRoundRobin.shutdownNow();
        }
    }

    record Result(long rpcs, double p50Us, double p99Us) {
    }

    static Result run(ManagedChannel channel, int seconds, int callers) throws InterruptedException {
        EchoGrpc.EchoBlockingStub stub = EchoGrpc.newBlockingStub(channel);
        EchoRequest request = EchoRequest.newBuilder().setMessage("bench").build();
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        List<long[]> latencies = new ArrayList<>();
        AtomicLong total = new AtomicLong();
        List<Thread> threads = new ArrayList<>();
        for (int c = 0; c < callers; c++) {
            long[] mine = new long[4_000_000];
            latencies.add(mine);
            Thread thread = new Thread(() -> {
                int n = 0;
                while (System.nanoTime() < end && n < mine.length) {
                    long start = System.nanoTime();
                    stub.withDeadlineAfter(10, TimeUnit.SECONDS).echo(request);
                    mine[n++] = System.nanoTime() - start;
                }
                total.addAndGet(n);
                mine[mine.length - 1] = n;
            });
            threads.add(thread);
            thread.start();
        }
        for (Thread thread : threads) {
            thread.join();
        }
        long[] all = new long[(int) total.get()];
        int at = 0;
        for (long[] mine : latencies) {
            int n = (int) mine[mine.length - 1];
            System.arraycopy(mine, 0, all, at, n);
            at += n;
        }
        Arrays.sort(all);
        return new Result(all.length, all[all.length / 2] / 1e3, all[(int) (all.length * 0.99)] / 1e3);
    }

    /** A fixed address list for the round_robin baseline. */
    private static final class StaticResolver extends NameResolverProvider {
        private final List<EquivalentAddressGroup> groups = new ArrayList<>();

        StaticResolver(List<InetSocketAddress> addresses) {
            addresses.forEach(a -> groups.add(new EquivalentAddressGroup(a)));
        }

        @Override
        protected boolean isAvailable() {
            return true;
        }

        @Override
        protected int priority() {
            return 4;
        }

        @Override
        public String getDefaultScheme() {
            return "bench-static";
        }

        @Override
        public Collection<Class<? extends SocketAddress>> getProducedSocketAddressTypes() {
            return List.of(InetSocketAddress.class);
        }

        @Override
        public NameResolver newNameResolver(URI target, NameResolver.Args args) {
            if (!"bench-static".equals(target.getScheme())) {
                return null;
            }
            return new NameResolver() {
                @Override
                public String getServiceAuthority() {
                    return "echo";
                }

                @Override
                public void start(Listener2 listener) {
                    listener.onResult2(ResolutionResult.newBuilder()
                            .setAddressesOrError(StatusOr.fromValue(groups)).build());
                }

                @Override
                public void shutdown() {
                }
            };
        }
    }
}
