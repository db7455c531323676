package io.rota.client;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import io.grpc.Status;
import io.rota.v1.PickRequest;

/**
 * Picks from a locally kept instance list while rota is unreachable, by round robin as the
 * conformance README's local fallback contract says: version isolation first (version V picks
 * the UP instances of version V, else the UP instances with no version; no version picks the UP
 * instances with no version); ticket {@code t} takes position {@code t mod k} among the k
 * instances of that subset (by id) that are not excluded, as rota's round robin does.
 *
 * <p>A subset that is empty or all excluded fails as on rota ({@code UNAVAILABLE}, reason
 * {@code no_eligible_instance}): exclusion never sends a versioned pick to the unversioned
 * instances. One counter per (service, subset) numbers the local picks 0, 1, 2, ...
 */
final class LocalBalancer {
    static final String RULE = "round_robin";
    static final String NO_ELIGIBLE_INSTANCE = "no_eligible_instance";

    private final ConcurrentHashMap<String, AtomicLong> counters = new ConcurrentHashMap<>();

    /**
     * Picks for {@code request} from {@code instances} (ordered by id).
     *
     * @throws RotaException {@code UNAVAILABLE} ({@code no_eligible_instance}) when nothing is eligible
     */
    Pick pick(PickRequest request, List<Instance> instances, long epoch) {
        String version = request.getVersion();
        String subset = version;
        String fallback = "";
        List<Instance> candidates = upWithVersion(instances, version);
        if (candidates.isEmpty() && !version.isEmpty()) {
            candidates = upWithVersion(instances, "");
            subset = "";
            fallback = "no instance with version " + quoted(version) + "; picked from instances with no version";
        }
        Set<String> excluded = Set.copyOf(request.getExcludeList());
        List<Instance> accepted = candidates.stream().filter(i -> !excluded.contains(i.id())).toList();
        if (accepted.isEmpty()) {
            throw new RotaException(Status.Code.UNAVAILABLE, unavailable(request), NO_ELIGIBLE_INSTANCE, false,
                    null);
        }
        long ticket = counters.computeIfAbsent(request.getService() + '\0' + subset, k -> new AtomicLong())
                .getAndIncrement();
        Instance chosen = accepted.get((int) Long.remainderUnsigned(ticket, accepted.size()));
        return new Pick(chosen, ticket, RULE, fallback, epoch, true);
    }

    private static String unavailable(PickRequest request) {
        String version = request.getVersion();
        String text = "service " + quoted(request.getService()) + " has no UP instance"
                + (version.isEmpty() ? " without a version" : " with version " + quoted(version) + " nor without a version");
        if (!request.getExcludeList().isEmpty()) {
            text += " that is not excluded";
        }
        return text + " (picked locally: rota is unreachable)";
    }

    private static List<Instance> upWithVersion(List<Instance> instances, String version) {
        List<Instance> matching = new ArrayList<>();
        for (Instance instance : instances) {
            if (instance.status() == InstanceStatus.UP && instance.version().equals(version)) {
                matching.add(instance);
            }
        }
        return matching;
    }

    /** A string in double quotes with quotes and backslashes escaped, as rota words its messages. */
    private static String quoted(String s) {
        return '"' + s.replace("\\", "\\\\").replace("\"", "\\\"") + '"';
    }
}
