package io.rota.client;

import java.util.List;
import java.util.stream.Collectors;

import io.grpc.Status;

/**
 * {@link RotaClient#register} was refused for some of its instances; the ones accepted were
 * withdrawn again, so nothing of it stays registered. The code is that of the first refusal
 * ({@code INVALID_ARGUMENT} for a port 0, {@code ALREADY_EXISTS} for an id another registration
 * holds, ...).
 */
public final class RegistrationRefusedException extends RotaException {
    private static final long serialVersionUID = 1L;

    private final transient Ack ack;

    RegistrationRefusedException(Ack ack) {
        super(ack.refused().isEmpty() ? Status.Code.UNKNOWN : ack.refused().get(0).code(), describe(ack.refused()), "",
                false, null);
        this.ack = ack;
    }

    private static String describe(List<Refusal> refused) {
        return "registration refused: " + refused.stream()
                .map(r -> r.instance().service() + "/" + r.instance().id() + ": " + r.code() + ": " + r.message())
                .collect(Collectors.joining("; "));
    }

    /** rota's answer: what it accepted (and was withdrawn again) and what it refused, and why. */
    public Ack ack() {
        return ack;
    }

    /** The refused instances. */
    public List<Refusal> refused() {
        return ack.refused();
    }
}
