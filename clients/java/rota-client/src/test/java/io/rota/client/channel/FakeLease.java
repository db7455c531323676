package io.rota.client.channel;

import java.util.List;
import java.util.function.LongToIntFunction;

import io.rota.v1.Instance;
import io.rota.v1.LeaseRequest;
import io.rota.v1.LeaseResponse;

/** Ticket-range answers of the scripted rotas the channel tests lease from: instances and the position of each ticket. */
final class FakeLease {
    private FakeLease() {
    }

    /** Tickets {@code first ..} of {@code request}, ticket t at {@code position(t)} of {@code instances}. */
    static LeaseResponse.Builder range(List<Instance> instances, long first, int count, String rule, LongToIntFunction position) {
        LeaseResponse.Builder answer = LeaseResponse.newBuilder().setFirstTicket(count == 0 ? 0 : first).setCount(count)
                .addAllInstances(instances).setEpoch(1).setRule(rule);
        for (int i = 0; i < count; i++) {
            answer.addPositions(position.applyAsInt(first + i));
        }
        return answer;
    }

    /** round_robin as rota leases it: over {@code instances} but the request's excluded ones, ticket t at t mod n. */
    static LeaseResponse.Builder roundRobin(List<Instance> instances, LeaseRequest request, long first) {
        List<Instance> kept = instances.stream().filter(i -> !request.getExcludeList().contains(i.getId())).toList();
        return range(kept, first, request.getCount(), "round_robin", t -> (int) Long.remainderUnsigned(t, kept.size()));
    }

    /** The instances of these members. */
    static List<Instance> instances(List<Member> members) {
        return members.stream().map(m -> Instance.newBuilder().setId(m.id()).setHost(m.host()).setPort(m.port())
                .setVersion(m.version()).setWeight(m.weight()).build()).toList();
    }
}
