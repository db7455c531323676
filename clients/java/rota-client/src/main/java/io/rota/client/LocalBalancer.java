package io.rota.client;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import io.rota.v1.PickRequest;

/**
 * Picks from a locally kept instance list while rota is unreachable: round robin over the UP
 * instances, with the server's version isolation (version V picks instances of version V, else
 * instances with no version; no version picks instances with no version).
 *
 * <p>One counter per (service, subset), so each subset rotates on its own as on the server.
 */
final class LocalBalancer {
    static final String RULE = "round_robin";

    private final ConcurrentHashMap<String, AtomicLong> counters = new ConcurrentHashMap<>();

    /**
     * Picks for {@code request} from {@code instances} (ordered by id) or returns empty when none
     * is eligible.
     */
    Optional<Pick> pick(PickRequest request, List<Instance> instances, long epoch, String reason) {
        Set<String> excluded = new HashSet<>(request.getExcludeList());
        List<Instance> up = new ArrayList<>();
        for (Instance instance : instances) {
            if (instance.status() == InstanceStatus.UP && !excluded.contains(instance.id())) {
                up.add(instance);
            }
        }
        String version = request.getVersion();
        String subset = version;
        String fallback = reason;
        List<Instance> candidates = withVersion(up, version);
        if (candidates.isEmpty() && !version.isEmpty()) {
            candidates = withVersion(up, "");
            subset = "";
            fallback = reason + "; no instance with version \"" + version + "\"; picked from instances with no version";
        }
        if (candidates.isEmpty()) {
            return Optional.empty();
        }
        long ticket = counters.computeIfAbsent(request.getService() + '\0' + subset, k -> new AtomicLong())
                .getAndIncrement();
        Instance chosen = candidates.get((int) Long.remainderUnsigned(ticket, candidates.size()));
        return Optional.of(new Pick(chosen, ticket, RULE, fallback, epoch, true));
    }

    private static List<Instance> withVersion(List<Instance> instances, String version) {
        List<Instance> matching = new ArrayList<>();
        for (Instance instance : instances) {
            if (instance.version().equals(version)) {
                matching.add(instance);
            }
        }
        return matching;
    }
}
