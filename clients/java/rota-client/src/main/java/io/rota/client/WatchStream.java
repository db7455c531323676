package io.rota.client;

import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * A service's {@linkplain RotaClient#watch(String) watch} as a blocking iterator: a
 * {@link WatchEvent.Snapshot} first, then each change, until {@link #close()} or rota ends it.
 *
 * <pre>{@code
 * try (WatchStream events = rota.watch("orders")) {
 *     while (events.hasNext()) {
 *         WatchEvent event = events.next();
 *         ...
 *     }
 * }
 * }</pre>
 *
 * <p>{@link #hasNext()} waits for the next event; when the watch failed it throws that
 * {@link RotaException} (rota refused it, or could not be reached or was lost:
 * {@link RotaException#isUnreachable()}). Events are let in as they are taken, so a slow reader
 * holds rota's stream back rather than filling memory. Not for use by several threads at once,
 * except {@link #close()}, which also ends a wait in another thread.
 */
public final class WatchStream implements Iterator<WatchEvent>, AutoCloseable {
    /** Events let in ahead of the reader. */
    static final int WINDOW = 64;

    private final Object lock = new Object();
    private final ArrayDeque<WatchEvent> events = new ArrayDeque<>();
    private final Watch watch;
    private RotaException failure;
    private boolean ended;

    WatchStream(String service, java.util.function.Function<Throwable, RotaException> failures) {
        this.watch = new Watch(service, new WatchListener() {
            @Override
            public void onEvent(WatchEvent event) {
                synchronized (lock) {
                    events.addLast(event);
                    lock.notifyAll();
                }
            }

            @Override
            public void onError(RotaException error) {
                synchronized (lock) {
                    failure = error;
                    ended = true;
                    lock.notifyAll();
                }
            }

            @Override
            public void onCompleted() {
                end();
            }
        }, WINDOW, failures);
    }

    Watch watch() {
        return watch;
    }

    /** The service watched. */
    public String service() {
        return watch.service();
    }

    /**
     * Waits for the next event; false once the watch is closed or rota ended it (events that came
     * before are still returned first).
     *
     * @throws RotaException when the watch failed
     */
    @Override
    public boolean hasNext() {
        synchronized (lock) {
            while (events.isEmpty() && !ended) {
                try {
                    lock.wait();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new RotaException(io.grpc.Status.Code.CANCELLED, "interrupted while waiting for a watch event of "
                            + watch.service(), e);
                }
            }
            return available();
        }
    }

    /**
     * The next event, waiting for it.
     *
     * @throws NoSuchElementException when the watch is closed or ended
     * @throws RotaException          when the watch failed
     */
    @Override
    public WatchEvent next() {
        if (!hasNext()) {
            throw new NoSuchElementException("the watch of " + watch.service() + " is over");
        }
        return take();
    }

    /**
     * The next event if one comes within {@code timeout}; empty when none did, or the watch is
     * closed or ended.
     *
     * @throws RotaException when the watch failed
     */
    public Optional<WatchEvent> poll(Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        synchronized (lock) {
            long left;
            while (events.isEmpty() && !ended && (left = deadline - System.nanoTime()) > 0) {
                try {
                    TimeUnit.NANOSECONDS.timedWait(lock, left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new RotaException(io.grpc.Status.Code.CANCELLED, "interrupted while waiting for a watch event of "
                            + watch.service(), e);
                }
            }
            if (!available()) {
                return Optional.empty();
            }
        }
        return Optional.of(take());
    }

    /** Holds {@code lock}: an event is queued, or the watch's failure is thrown, or false. */
    private boolean available() {
        if (!events.isEmpty()) {
            return true;
        }
        if (failure != null) {
            // Thrown here, in the reader's thread; the failure as the watch saw it is the cause.
            throw new RotaException(failure.getCode(), failure.getDescription(), failure.reason(), failure.isUnreachable(),
                    failure);
        }
        return false;
    }

    private WatchEvent take() {
        WatchEvent event;
        synchronized (lock) {
            event = events.pollFirst();
        }
        watch.request();
        return event;
    }

    private void end() {
        synchronized (lock) {
            ended = true;
            lock.notifyAll();
        }
    }

    /** Ends the watch; a {@link #hasNext()} waiting in another thread returns false. Idempotent. */
    @Override
    public void close() {
        watch.close();
        synchronized (lock) {
            events.clear();
        }
        end();
    }

    @Override
    public String toString() {
        return "WatchStream{" + watch.service() + "}";
    }
}
