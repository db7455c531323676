package io.rota.client;

/**
 * Receives the events of a {@linkplain RotaClient#watch(String, WatchListener) watch}, one at a
 * time and in order, on a gRPC thread: keep {@link #onEvent} short, or hand the event on.
 */
@FunctionalInterface
public interface WatchListener {
    /** The next event: a {@link WatchEvent.Snapshot} first, then the changes. */
    void onEvent(WatchEvent event);

    /**
     * The watch failed and is over: rota refused it ({@code INVALID_ARGUMENT} for a bad service
     * name) or could not be reached or was lost ({@link RotaException#isUnreachable()}). It is not
     * reopened; a new {@code watch} starts again with a snapshot. Not called after {@link Watch#close()}.
     */
    default void onError(RotaException error) {
    }

    /** rota ended the watch (it is shutting down); not called after {@link Watch#close()}. */
    default void onCompleted() {
    }
}
