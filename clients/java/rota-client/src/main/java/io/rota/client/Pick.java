package io.rota.client;

import java.time.Duration;

import io.rota.v1.CallOutcome;
import io.rota.v1.CallResult;
import io.rota.v1.Instance;
import io.rota.v1.PickResponse;

/**
 * One instance chosen by rota.
 *
 * @param instance      the chosen instance
 * @param ticket        the number drawn from the shared counter for this pick
 * @param rule          the rule that ran, in canonical form, e.g. {@code "repeat(n=3)"}
 * @param fallback      empty when the request was served as asked; otherwise why a fallback was taken
 * @param epoch         the generation of the instance list the pick was made from
 * @param localFallback {@code true} when rota could not be reached and the client picked from the
 *                      instance list it last saw through {@code Watch}
 */
public record Pick(Instance instance, long ticket, String rule, String fallback, long epoch, boolean localFallback) {

    /** A pick as the server answered it. */
    public static Pick from(PickResponse response) {
        return new Pick(response.getInstance(), response.getTicket(), response.getRule(), response.getFallback(),
                response.getEpoch(), false);
    }

    public String service() {
        return instance.getService();
    }

    public String id() {
        return instance.getId();
    }

    public String host() {
        return instance.getHost();
    }

    public int port() {
        return instance.getPort();
    }

    public String version() {
        return instance.getVersion();
    }

    /** {@code host:port}, with IPv6 hosts in brackets. */
    public String authority() {
        String host = instance.getHost();
        return (host.indexOf(':') >= 0 ? "[" + host + "]" : host) + ":" + instance.getPort();
    }

    /** Whether a fallback was taken (a version fallback, or a local pick). */
    public boolean isFallback() {
        return !fallback.isEmpty();
    }

    /** The outcome of one call made to this instance, for {@link RotaClient#report}. */
    public CallOutcome outcome(CallResult result, Duration latency) {
        return CallOutcome.newBuilder()
                .setService(instance.getService())
                .setInstanceId(instance.getId())
                .setTicket(ticket)
                .setRule(rule)
                .setLatencyUs(Math.max(0, latency.toNanos() / 1_000))
                .setResult(result)
                .build();
    }
}
