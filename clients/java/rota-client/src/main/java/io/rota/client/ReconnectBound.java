package io.rota.client;

import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;

/**
 * Keeps a channel's reconnection delays within the client's own {@link Backoff}.
 *
 * <p>grpc-java backs off between connection attempts from 1 s up to 120 s and offers no setting
 * for that ceiling; its documented way to shorten a wait is
 * {@link ManagedChannel#resetConnectBackoff()}, which makes a channel in
 * {@link ConnectivityState#TRANSIENT_FAILURE} try again at once. Each time the channel enters
 * that state, this schedules such a reset after the backoff's next delay (full jitter, up to
 * its maximum), so a rota that comes back after a long outage is reached again within that
 * maximum (10 s by default) instead of up to two minutes. The attempt count starts over once
 * the channel is {@link ConnectivityState#READY}.
 */
final class ReconnectBound {
    private static final System.Logger LOG = System.getLogger(ReconnectBound.class.getName());
    private static final int MAX_ATTEMPT = 30;

    private final ManagedChannel channel;
    private final ScheduledExecutorService scheduler;
    private final Backoff backoff;
    private final AtomicBoolean closed = new AtomicBoolean();
    private int attempt;

    ReconnectBound(ManagedChannel channel, ScheduledExecutorService scheduler, Backoff backoff) {
        this.channel = channel;
        this.scheduler = scheduler;
        this.backoff = backoff;
    }

    void start() {
        watch(channel.getState(false));
    }

    void close() {
        closed.set(true);
    }

    private void watch(ConnectivityState seen) {
        if (closed.get() || seen == ConnectivityState.SHUTDOWN) {
            return;
        }
        channel.notifyWhenStateChanged(seen, () -> changed(channel.getState(false)));
    }

    private void changed(ConnectivityState now) {
        if (closed.get()) {
            return;
        }
        synchronized (this) {
            if (now == ConnectivityState.READY) {
                attempt = 0;
            } else if (now == ConnectivityState.TRANSIENT_FAILURE) {
                Duration delay = backoff.delay(Math.min(attempt, MAX_ATTEMPT));
                attempt++;
                try {
                    scheduler.schedule(this::reset, delay.toNanos(), TimeUnit.NANOSECONDS);
                } catch (RuntimeException e) {
                    // The client is closing: its scheduler takes no more tasks.
                    return;
                }
            }
        }
        watch(now);
    }

    private void reset() {
        if (!closed.get() && channel.getState(false) == ConnectivityState.TRANSIENT_FAILURE) {
            LOG.log(Level.DEBUG, "reconnecting to rota now rather than after grpc-java's own backoff");
            channel.resetConnectBackoff();
        }
    }
}
