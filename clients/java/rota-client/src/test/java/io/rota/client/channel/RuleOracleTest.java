package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.IntStream;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;
import io.rota.v1.BalancerGrpc;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;

/** The channel scenarios' test oracle against rota's own positions, so that the runner checks rota against the rules rota runs. */
class RuleOracleTest {
    @Test
    void theWeightedScheduleInterleavesByEarliestDeadline() {
        assertArrayEquals(new int[] {0, 0, 0, 1, 2, 0, 0}, RuleOracle.schedule(new int[] {5, 1, 1}));
        assertArrayEquals(new int[] {0, 1, 0}, RuleOracle.schedule(new int[] {2, 1}));
        assertArrayEquals(new int[] {0, 0, 2, 0}, RuleOracle.schedule(new int[] {3, 0, 1}));
    }

    @Test
    @ExtendWith(SharedRotaServer.class)
    void theOracleNamesThePositionsRotaLeases(RotaServer rota) throws Exception {
        String service = "oracle-vs-lease";
        int[] weights = {7, 3, 0, 5, 1};
        ManagedChannel channel = Grpc.newChannelBuilder(rota.target(), InsecureChannelCredentials.create()).build();
        try (RotaClient provider = RotaClient.builder().target(rota.target()).build()) {
            List<Instance> instances = IntStream.range(0, weights.length)
                    .mapToObj(i -> Instance.of(service, "127.0.0.1", 9000 + i).withId("m" + i).withWeight(weights[i]))
                    .toList();
            Registration registration = provider.register(instances);
            BalancerGrpc.BalancerBlockingStub balancer = BalancerGrpc.newBlockingStub(channel)
                    .withDeadlineAfter(20, TimeUnit.SECONDS);
            for (String rule : List.of("round_robin", "repeat(n=3)", "weighted")) {
                // Two blocks, the second one not starting at a cycle's start.
                for (int count : new int[] {17, 40}) {
                    LeaseResponse lease = balancer.lease(LeaseRequest.newBuilder().setService(service).setRule(rule)
                            .setCount(count).build());
                    int[] leased = lease.getInstancesList().stream()
                            .mapToInt(i -> i.hasWeight() ? i.getWeight() : 100).toArray();
                    RuleOracle oracle = new RuleOracle(lease.getRule(), leased);
                    assertEquals(count, lease.getPositionsCount(), rule);
                    for (int i = 0; i < count; i++) {
                        long ticket = lease.getFirstTicket() + i;
                        assertEquals(oracle.position(ticket), lease.getPositions(i), rule + " ticket " + ticket);
                    }
                }
            }
            registration.close();
        } finally {
            channel.shutdownNow();
        }
    }
}
