package io.rota.client;

import java.time.Duration;

/**
 * One instance chosen by rota.
 *
 * @param instance      the chosen instance
 * @param ticket        the number drawn from the shared counter for this pick (an unsigned 64-bit number);
 *                      on a local pick, the client's own count 0, 1, 2, ... per service and version subset
 * @param rule          the rule that ran, in canonical form, e.g. {@code "repeat(n=3)"}
 * @param fallback      empty when the request was served as asked; otherwise why a fallback was taken
 *                      (also on a local pick: it keeps rota's meaning)
 * @param epoch         the generation of the instance list the pick was made from (an unsigned 64-bit number)
 * @param localFallback {@code true} when rota's answer could not be had and the client picked from the
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

    /** Whether the client picked this instance itself, rota being unreachable (same as {@link #localFallback()}). */
    public boolean isLocalFallback() {
        return localFallback;
    }

    /**
     * Whether rota (or the local fallback, picking as rota would) took a fallback, e.g. no
     * instance of the requested version; a local pick is told by {@link #localFallback()}.
     */
    public boolean isFallback() {
        return !fallback.isEmpty();
    }

    /** The outcome of one call made to this instance, for {@link RotaClient#report}. */
    public CallOutcome outcome(CallResult result, Duration latency) {
        return new CallOutcome(instance.service(), instance.id(), ticket, rule, latency, result);
    }
}
