package io.rota.client;

import java.time.Duration;

/**
 * One instance chosen by rota.
 *
 * @param instance      the chosen instance
 * @param ticket        the number drawn from the shared counter for this pick (an unsigned 64-bit number)
 * @param rule          the rule that ran, in canonical form, e.g. {@code "repeat(n=3)"}
 * @param fallback      empty when the request was served as asked; otherwise why a fallback was taken
 * @param epoch         the generation of the instance list the pick was made from (an unsigned 64-bit number)
 * @param localFallback {@code true} when rota could not be reached and the client picked from the
 *                      instance list it last saw through {@code Watch}
 */
public record Pick(Instance instance, long ticket, String rule, String fallback, long epoch, boolean localFallback) {

    public String service() {
        return instance.service();
    }

    public String id() {
        return instance.id();
    }

    public String host() {
        return instance.host();
    }

    public int port() {
        return instance.port();
    }

    public String version() {
        return instance.version();
    }

    /** {@code host:port}, with IPv6 hosts in brackets. */
    public String authority() {
        return instance.authority();
    }

    /** Whether a fallback was taken (a version fallback, or a local pick). */
    public boolean isFallback() {
        return !fallback.isEmpty();
    }

    /** The outcome of one call made to this instance, for {@link RotaClient#report}. */
    public CallOutcome outcome(CallResult result, Duration latency) {
        return new CallOutcome(instance.service(), instance.id(), ticket, rule, latency, result);
    }
}
