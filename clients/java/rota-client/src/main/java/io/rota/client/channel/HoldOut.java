package io.rota.client.channel;

import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;

/**
 * Whether a channel holds one instance out for timeouts (docs/channels.md, "Instances the channel
 * cannot use"): after {@value #TIMEOUTS} calls in a row to it ended {@code DEADLINE_EXCEEDED}
 * with no answer, it is unusable for 10 s (its tickets are passed over, and leases exclude it);
 * when the hold is over the next call whose ticket goes to it tries it again, and each further
 * {@value #TIMEOUTS} timeouts in a row double the hold (at most 60 s). An answer from it (any status the server sent) ends the count and brings the next
 * hold back to 10 s. Timeouts of calls that end while it is held out were sent before the hold
 * began (it is sent nothing during one) and do not count.
 *
 * <p>{@link #heldOut} is on every RPC's path: one volatile read while the instance is not held.
 */
final class HoldOut {
    static final int TIMEOUTS = 3;
    static final long FIRST_HOLD_NANOS = TimeUnit.SECONDS.toNanos(10);
    static final long LONGEST_HOLD_NANOS = TimeUnit.SECONDS.toNanos(60);

    private final LongSupplier clock;
    /** Whether a hold was started; it is over once the clock passes {@link #until}. */
    private volatile boolean held;
    private volatile long until;
    // Guarded by this.
    private int inARow;
    private long nextHold = FIRST_HOLD_NANOS;

    /** @param clock nanoseconds, as {@link System#nanoTime} counts them */
    HoldOut(LongSupplier clock) {
        this.clock = clock;
    }

    /** Whether the instance is held out now. */
    boolean heldOut() {
        return held && clock.getAsLong() - until < 0;
    }

    /** A call to the instance ended {@code DEADLINE_EXCEEDED} with no answer from it. */
    synchronized void timedOut() {
        long now = clock.getAsLong();
        if (held && now - until < 0) {
            return;
        }
        if (++inARow < TIMEOUTS) {
            return;
        }
        inARow = 0;
        until = now + nextHold;
        held = true;
        nextHold = Math.min(2 * nextHold, LONGEST_HOLD_NANOS);
    }

    /** The instance answered a call (success or a status it sent). */
    synchronized void answered() {
        inARow = 0;
        nextHold = FIRST_HOLD_NANOS;
        if (held && clock.getAsLong() - until >= 0) {
            // Over, and the instance answers again: heldOut is one read again.
            held = false;
        }
    }

    /** The hold the next {@value #TIMEOUTS} timeouts in a row would start, in nanoseconds. */
    synchronized long nextHoldNanos() {
        return nextHold;
    }
}
