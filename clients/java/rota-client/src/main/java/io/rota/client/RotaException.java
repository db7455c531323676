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

    /**
     * Converts a failed gRPC call, keeping it as the cause. A connection that broke under the call,
     * which grpc-java reports as {@code UNKNOWN} or {@code INTERNAL}, becomes {@code UNAVAILABLE}:
     * an unreachable rota is always {@code UNAVAILABLE} or {@code DEADLINE_EXCEEDED}.
     */
    public static RotaException from(StatusRuntimeException e) {
        Status status = e.getStatus();
        String description = status.getDescription();
        if (description == null && status.getCause() != null) {
            description = status.getCause().toString();
        }
        if (brokenConnection(status.getCode(), e.getTrailers())) {
            return new RotaException(Status.Code.UNAVAILABLE, "connection to rota lost: " + describe(status), "",
                    true, e);
        }
        String reason = reason(e.getTrailers());
        return new RotaException(status.getCode(), description, reason, unreachable(status.getCode(), reason), e);
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
     * way (connection refused or lost, deadline expired, a proxy with no rota behind it): rota
     * marks every pick failure it decides with a reason, {@code warming_up} included. The
     * definition every client shares is in {@code clients/conformance/README.md}.
     */
    private static boolean unreachable(Status.Code code, String reason) {
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

    /**
     * This failure, if rota was unreachable, with the address that could not be reached and why
     * (connection refused, unknown host, no answer in time, ...) at the head of its description;
     * else this failure itself. Code, reason and {@link #isUnreachable()} are kept.
     */
    RotaException at(String server) {
        if (!unreachable || description.startsWith(UNREACHABLE_PREFIX)) {
            return this;
        }
        String why = transportCause(getCause());
        String grpc = description.isEmpty() ? code.toString() : description;
        String text = code == Status.Code.DEADLINE_EXCEEDED && why == null
                ? UNREACHABLE_PREFIX + server + " did not answer in time (" + grpc + ")"
                : UNREACHABLE_PREFIX + server + " unreachable: " + (why == null ? grpc : why + " (" + grpc + ")");
        return new RotaException(code, text, reason, true, getCause() != null ? getCause() : this);
    }

    private static final String UNREACHABLE_PREFIX = "rota at ";
    private static final java.util.regex.Pattern NATIVE_ERROR = java.util.regex.Pattern.compile("failed with error\\(-?\\d+\\): ");

    /**
     * What the transport said under a failed call, in a few words: the innermost cause's message
     * without the address it repeats ("Connection refused: /127.0.0.1:1" becomes
     * "connection refused"); null when there is no such cause.
     */
    static String transportCause(Throwable failure) {
        Throwable inner = null;
        Throwable t = failure;
        for (int depth = 0; t != null && depth < 16; depth++, t = t.getCause()) {
            if (!(t instanceof StatusRuntimeException) && !(t instanceof io.grpc.StatusException) && !(t instanceof RotaException)) {
                inner = t;
            }
        }
        if (inner == null) {
            return null;
        }
        String message = inner.getMessage();
        if (message == null || message.isBlank()) {
            return inner.getClass().getSimpleName();
        }
        if (inner instanceof java.net.SocketException) {
            // Netty's native transport: "finishConnect(..) failed with error(-111): Connection refused".
            java.util.regex.Matcher errno = NATIVE_ERROR.matcher(message);
            if (errno.find()) {
                message = message.substring(errno.end());
            }
            int address = message.indexOf(": /");
            if (address > 0) {
                message = message.substring(0, address);
            }
        }
        return Character.toLowerCase(message.charAt(0)) + message.substring(1);
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
     * Whether rota could not be reached, as opposed to answering: {@code UNAVAILABLE} or
     * {@code DEADLINE_EXCEEDED} without a {@link #reason()} (connection refused or lost, deadline
     * expired), including a connection that broke under the call. A rota {@linkplain #WARMING_UP
     * warming up} answered, so that is not unreachable; see {@link #fallsBack()}.
     */
    public boolean isUnreachable() {
        return unreachable;
    }

    /**
     * Whether a failed pick is answered by the local fallback: rota is unreachable, or it is
     * {@linkplain #WARMING_UP warming up} after a restart and cannot decide yet.
     */
    public boolean fallsBack() {
        return unreachable || WARMING_UP.equals(reason);
    }
}
