package io.rota.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;

/**
 * A rota call that failed, with the gRPC status code the server (or the transport) gave.
 *
 * <p>Pick failures map as follows: {@link Status.Code#INVALID_ARGUMENT} for a bad service name,
 * an unknown rule or bad rule parameters; {@link Status.Code#NOT_FOUND} for a service that was
 * never registered; {@link Status.Code#UNAVAILABLE} when nothing is eligible, or when rota cannot
 * be reached and no local fallback could answer.
 */
public class RotaException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final Status.Code code;
    private final String description;

    public RotaException(Status.Code code, String description) {
        this(code, description, null);
    }

    public RotaException(Status.Code code, String description, Throwable cause) {
        super(code + ": " + (description == null ? "" : description), cause);
        this.code = code;
        this.description = description == null ? "" : description;
    }

    /** Converts a failed gRPC call, keeping it as the cause. */
    public static RotaException from(StatusRuntimeException e) {
        Status status = e.getStatus();
        String description = status.getDescription();
        if (description == null && status.getCause() != null) {
            description = status.getCause().toString();
        }
        return new RotaException(status.getCode(), description, e);
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
}
