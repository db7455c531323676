package io.rota.client;

import java.time.Duration;
import java.util.List;
import java.util.Objects;

/**
 * rota's answer to one announcement, update or withdrawal of a registration.
 *
 * @param leaseId          the lease of the registration's stream; a reconnected registration
 *                         gets a new one (an unsigned 64-bit number)
 * @param seq              1 for the first message of a stream, 2 for the next, ...
 * @param accepted         the instances the message applied to
 * @param refused          the instances it did not apply to, and why
 * @param heartbeatTimeout how long rota keeps the stream without a message
 */
public record Ack(long leaseId, long seq, List<InstanceRef> accepted, List<Refusal> refused, Duration heartbeatTimeout) {
    public Ack {
        accepted = List.copyOf(accepted);
        refused = List.copyOf(refused);
        Objects.requireNonNull(heartbeatTimeout, "heartbeatTimeout");
    }

    /** The ids of the accepted instances, in order. */
    public List<String> acceptedIds() {
        return accepted.stream().map(InstanceRef::id).toList();
    }
}
