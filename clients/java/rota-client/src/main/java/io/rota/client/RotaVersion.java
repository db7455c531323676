package io.rota.client;

import java.util.Optional;
import java.util.concurrent.Callable;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.Context;
import io.grpc.Contexts;
import io.grpc.ForwardingClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;

/**
 * The version the current call chain asks for, so that a developer's version follows a request
 * from service to service.
 *
 * <p>The version lives in the gRPC {@link Context} (a thread-bound value that gRPC carries across
 * its own threads). An incoming request sets it, through {@link #serverInterceptor()} for gRPC
 * servers or a web filter for HTTP servers; {@link RotaClient#pick} uses it when no version is
 * given; {@link #clientInterceptor()} forwards it as the {@value #HEADER} header of outgoing gRPC
 * calls.
 *
 * <pre>{@code
 * try (RotaVersion.Scope scope = RotaVersion.open("zlt")) {
 *     client.pick("orders");   // asks for version "zlt"
 * }
 * }</pre>
 */
public final class RotaVersion {
    /** The header (gRPC metadata key) carrying the version; HTTP header names are case-insensitive. */
    public static final String HEADER = "x-rota-version";

    public static final Metadata.Key<String> METADATA_KEY = Metadata.Key.of(HEADER, Metadata.ASCII_STRING_MARSHALLER);

    static final Context.Key<String> CONTEXT_KEY = Context.key("rota-version");

    private RotaVersion() {
    }

    /** The version of the current call chain; empty when it asks for none. */
    public static Optional<String> current() {
        return Optional.ofNullable(normalize(CONTEXT_KEY.get()));
    }

    /**
     * Makes {@code version} current until the returned scope is closed; {@code null} or blank
     * means "no version" (hiding an outer one). Close scopes in the reverse order of opening, on
     * the same thread.
     */
    public static Scope open(String version) {
        Context context = Context.current().withValue(CONTEXT_KEY, normalize(version));
        Context previous = context.attach();
        return () -> context.detach(previous);
    }

    /** Runs {@code action} with {@code version} current. */
    public static void run(String version, Runnable action) {
        try (Scope ignored = open(version)) {
            action.run();
        }
    }

    /** Calls {@code action} with {@code version} current. */
    public static <T> T call(String version, Callable<T> action) throws Exception {
        try (Scope ignored = open(version)) {
            return action.call();
        }
    }

    /** Wraps {@code action} so that it runs with the version current now, on whatever thread runs it. */
    public static Runnable wrap(Runnable action) {
        return Context.current().wrap(action);
    }

    /** Reads {@value #HEADER} from each incoming call and makes it current while the call is handled. */
    public static ServerInterceptor serverInterceptor() {
        return ServerVersionInterceptor.INSTANCE;
    }

    /** Adds the current version as {@value #HEADER} to each outgoing call that has none. */
    public static ClientInterceptor clientInterceptor() {
        return ClientVersionInterceptor.INSTANCE;
    }

    static String normalize(String version) {
        if (version == null) {
            return null;
        }
        String trimmed = version.trim();
        return trimmed.isEmpty() ? null : trimmed;
    }

    /** A version made current by {@link #open}; closing it restores the previous one. */
    @FunctionalInterface
    public interface Scope extends AutoCloseable {
        @Override
        void close();
    }

    private enum ServerVersionInterceptor implements ServerInterceptor {
        INSTANCE;

        @Override
        public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
                ServerCallHandler<Q, R> next) {
            String version = normalize(headers.get(METADATA_KEY));
            if (version == null) {
                return next.startCall(call, headers);
            }
            return Contexts.interceptCall(Context.current().withValue(CONTEXT_KEY, version), call, headers, next);
        }
    }

    private enum ClientVersionInterceptor implements ClientInterceptor {
        INSTANCE;

        @Override
        public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
            return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
                @Override
                public void start(Listener<R> listener, Metadata headers) {
                    if (!headers.containsKey(METADATA_KEY)) {
                        current().ifPresent(version -> headers.put(METADATA_KEY, version));
                    }
                    super.start(listener, headers);
                }
            };
        }
    }
}
