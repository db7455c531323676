package io.rota.client;

import java.time.Duration;
import java.util.Objects;

/**
 * The outcome of one call to a picked instance, for {@link RotaClient#report}; usually made by
 * {@link Pick#outcome}.
 *
 * @param service    the instance's service
 * @param instanceId the instance's id
 * @param ticket     the ticket of the pick the call followed (0 when none)
 * @param rule       the rule of that pick (empty when none)
 * @param latency    how long the call took
 * @param result     how it went
 */
public record CallOutcome(String service, String instanceId, long ticket, String rule, Duration latency,
        CallResult result) {
    public CallOutcome {
        Objects.requireNonNull(service, "service");
        Objects.requireNonNull(instanceId, "instanceId");
        Objects.requireNonNull(rule, "rule");
        Objects.requireNonNull(result, "result");
        latency = latency.isNegative() ? Duration.ZERO : latency;
    }
}
