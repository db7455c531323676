package io.rota.client;

import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;

/**
 * A rota call that failed, with the gRPC status code the server (or the transport) gave.
 *
 * <p>Pick failures map as follows: {@link Status.Code#INVALID_ARGUMENT} for a bad service name,
 * an unknown rule or bad rule parameters; {@link Status.Code#NOT_FOUND} for a service that was
 * never registered; {@link Status.Code#UNAVAILABLE} when nothing is eligible, or when rota cannot
 * be reached and no local fallback could answer. {@link #reason()} and {@link #isUnreachable()}
 * tell those last two apart.
 */
public class RotaException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** The trailer in which rota names why it refused a pick. */
    static final Metadata.Key<String> REASON_KEY = Metadata.Key.of("rota-error", Metadata.ASCII_STRING_MARSHALLER);
    /** The {@link #reason()} of a rota that started recently and has not seen the service yet. */
    public static final String WARMING_UP = "warming_up";

    private final Status.Code code;
    private final String description;
    private final String reason;
    private final boolean unreachable;

    public RotaException(Status.Code code, String description) {
        this(code, description, null);
    }

    public RotaException(Status.Code code, String description, Throwable cause) {
        this(code, description, "", cause);
    }

    /**
     * @param reason the {@code rota-error} trailer rota sent with the failure, {@code ""} when
     *               there was none
     */
    public RotaException(Status.Code code, String description, String reason, Throwable cause) {
        this(code, description, reason, unreachable(code, reason), cause);
    }

    RotaException(Status.Code code, String description, String reason, boolean unreachable, Throwable cause) {
        super(code + ": " + (description == null ? "" : description), cause);
        this.code = code;
        this.description = description == null ? "" : description;
        this.reason = reason == null ? "" : reason;
        this.unreachable = unreachable;
    }

    /** Converts a failed gRPC call, keeping it as the cause. */
    public static RotaException from(StatusRuntimeException e) {
        Status status = e.getStatus();
        String description = status.getDescription();
        if (description == null && status.getCause() != null) {
            description = status.getCause().toString();
        }
        String reason = reason(e.getTrailers());
        return new RotaException(status.getCode(), description, reason,
                unreachable(status.getCode(), reason) || brokenConnection(status.getCode(), e.getTrailers()), e);
    }

    /** Converts any throwable from a gRPC call; non-gRPC failures become {@code UNKNOWN}. */
    static RotaException from(Throwable t) {
        if (t instanceof RotaException r) {
            return r;
        }
        if (t instanceof StatusRuntimeException e) {
            return from(e);
        }
        Status status = Status.fromThrowable(t);
        return new RotaException(status.getCode(), status.getDescription() != null ? status.getDescription() : String.valueOf(t), t);
    }

    private static String reason(Metadata trailers) {
        String value = trailers == null ? null : trailers.get(REASON_KEY);
        return value == null ? "" : value;
    }

    /**
     * {@code UNAVAILABLE} or {@code DEADLINE_EXCEEDED} without rota's reason was made up on the
     * way (connection refused or lost, deadline expired); {@code warming_up} is rota saying it
     * cannot answer yet. Both mean: rota's answer is not to be had now.
     */
    private static boolean unreachable(Status.Code code, String reason) {
        if (WARMING_UP.equals(reason)) {
            return true;
        }
        return (code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED)
                && (reason == null || reason.isEmpty());
    }

    /**
     * grpc-java reports a connection closed or broken mid-call as {@code UNKNOWN} or
     * {@code INTERNAL}; such a status comes without any trailer, where every answer of a server
     * has at least its response headers.
     */
    private static boolean brokenConnection(Status.Code code, Metadata trailers) {
        return (code == Status.Code.UNKNOWN || code == Status.Code.INTERNAL)
                && (trailers == null || trailers.keys().isEmpty());
    }

    /** {@code CODE: description (cause)}, on one line. */
    static String describe(Status status) {
        StringBuilder text = new StringBuilder(status.getCode().toString());
        if (status.getDescription() != null) {
            text.append(": ").append(status.getDescription());
        }
        if (status.getCause() != null) {
            text.append(" (").append(status.getCause()).append(')');
        }
        return text.toString();
    }

    /** The gRPC status code. */
    public Status.Code getCode() {
        return code;
    }

    /** The status message alone, without the code. */
    public String getDescription() {
        return description;
    }

    /**
     * rota's stable token for why it refused a pick (the {@code rota-error} trailer:
     * {@code no_eligible_instance}, {@code unknown_service}, {@code invalid_rule},
     * {@code warming_up}, ...); empty when the failure did not come from rota.
     */
    public String reason() {
        return reason;
    }

    /**
     * Whether rota's answer could not be had: rota could not be reached or did not answer in time
     * ({@code UNAVAILABLE} or {@code DEADLINE_EXCEEDED} without a {@link #reason()}), or it is
     * {@linkplain #WARMING_UP warming up}. These are the failures a local fallback answers.
     */
    public boolean isUnreachable() {
        return unreachable;
    }
}
