package io.rota.client;

import java.util.concurrent.CompletableFuture;

import io.grpc.Context;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.rota.v1.RegistryGrpc;
import io.rota.v1.WatchRequest;

/**
 * One open {@code Watch} of a service (see {@link RotaClient#watch(String, WatchListener)}): its
 * events go to the listener until {@link #close()}, a failure or rota's end of the stream. It is
 * one stream and does not reconnect; {@link RotaClient#follow} keeps a list that does.
 */
public final class Watch implements AutoCloseable {
    private final String service;
    private final WatchListener listener;
    private final int window;
    private final java.util.function.Function<Throwable, RotaException> failure;
    private final CompletableFuture<Void> done = new CompletableFuture<>();
    private final Object lock = new Object();
    private ClientCallStreamObserver<WatchRequest> call;
    private boolean closed;

    /**
     * @param window 0: events as they come; n: n events at first, then one more per
     *               {@link #request()} (the iterator's flow control)
     */
    Watch(String service, WatchListener listener, int window, java.util.function.Function<Throwable, RotaException> failure) {
        this.service = service;
        this.listener = listener;
        this.window = window;
        this.failure = failure;
    }

    void start(RegistryGrpc.RegistryStub stub) {
        // A watch outlives whatever call started it: never inherit its deadline or cancellation.
        Context.ROOT.run(() -> stub.watch(WatchRequest.newBuilder().setService(service).build(), new Observer()));
    }

    /** The service watched. */
    public String service() {
        return service;
    }

    /**
     * Completes when the watch is over: normally after {@link #close()} or when rota ended it,
     * exceptionally with the {@link RotaException} the listener's {@code onError} was given.
     */
    public CompletableFuture<Void> done() {
        return done.copy();
    }

    /** Whether events may still come: not closed, not failed, not ended by rota. */
    public boolean isOpen() {
        return !done.isDone();
    }

    /** Ends the watch; no event is delivered after it returns (except one being delivered). Idempotent. */
    @Override
    public void close() {
        ClientCallStreamObserver<WatchRequest> open;
        synchronized (lock) {
            if (closed) {
                return;
            }
            closed = true;
            open = call;
        }
        if (open != null) {
            open.cancel("watch closed by the client", null);
        }
        done.complete(null);
    }

    /** Lets one more event in (iterator mode). */
    void request() {
        ClientCallStreamObserver<WatchRequest> open;
        synchronized (lock) {
            open = closed ? null : call;
        }
        if (open != null) {
            open.request(1);
        }
    }

    private boolean isClosed() {
        synchronized (lock) {
            return closed;
        }
    }

    private final class Observer implements ClientResponseObserver<WatchRequest, io.rota.v1.WatchEvent> {
        @Override
        public void beforeStart(ClientCallStreamObserver<WatchRequest> requestStream) {
            if (window > 0) {
                requestStream.disableAutoRequestWithInitial(window);
            }
            boolean cancel;
            synchronized (lock) {
                call = requestStream;
                cancel = closed;
            }
            if (cancel) {
                requestStream.cancel("watch closed by the client", null);
            }
        }

        @Override
        public void onNext(io.rota.v1.WatchEvent message) {
            WatchEvent event = Wire.watchEvent(message);
            if (event == null) {
                // An event of a newer rota this client does not know: skipped, and another let in.
                if (window > 0) {
                    request();
                }
                return;
            }
            if (!isClosed()) {
                listener.onEvent(event);
            }
        }

        @Override
        public void onError(Throwable t) {
            if (isClosed()) {
                return;
            }
            RotaException error = failure.apply(t);
            if (done.completeExceptionally(error)) {
                listener.onError(error);
            }
        }

        @Override
        public void onCompleted() {
            if (!isClosed() && done.complete(null)) {
                listener.onCompleted();
            }
        }
    }

    @Override
    public String toString() {
        return "Watch{" + service + (isOpen() ? "" : ", done") + "}";
    }
}
