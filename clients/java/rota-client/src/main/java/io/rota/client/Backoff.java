package io.rota.client;

import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.DoubleSupplier;

/**
 * Exponential backoff with full jitter: the ceiling of attempt {@code n} is
 * {@code min(max, initial * multiplier^n)} and the delay is drawn uniformly from
 * {@code [0, ceiling)}. Used between reconnections of registration and watch streams.
 *
 * <p>Instances are immutable; {@link #withRandom} gives a copy with another random source (a
 * supplier of doubles in {@code [0, 1)}), which makes delays reproducible in tests.
 */
public final class Backoff {
    /** 100 ms doubling up to 10 s, with full jitter. */
    public static final Backoff DEFAULT = exponential(Duration.ofMillis(100), Duration.ofSeconds(10));

    private final long initialNanos;
    private final long maxNanos;
    private final double multiplier;
    private final DoubleSupplier random;

    private Backoff(long initialNanos, long maxNanos, double multiplier, DoubleSupplier random) {
        if (initialNanos <= 0 || maxNanos < initialNanos) {
            throw new IllegalArgumentException("need 0 < initial <= max");
        }
        if (!(multiplier >= 1.0)) {
            throw new IllegalArgumentException("multiplier must be at least 1");
        }
        this.initialNanos = initialNanos;
        this.maxNanos = maxNanos;
        this.multiplier = multiplier;
        this.random = Objects.requireNonNull(random, "random");
    }

    /** Doubling from {@code initial} up to {@code max}. */
    public static Backoff exponential(Duration initial, Duration max) {
        return new Backoff(initial.toNanos(), max.toNanos(), 2.0, () -> ThreadLocalRandom.current().nextDouble());
    }

    public Backoff withMultiplier(double multiplier) {
        return new Backoff(initialNanos, maxNanos, multiplier, random);
    }

    /** The same backoff drawing its jitter from {@code random} (values in {@code [0, 1)}). */
    public Backoff withRandom(DoubleSupplier random) {
        return new Backoff(initialNanos, maxNanos, multiplier, random);
    }

    /** The largest delay of attempt {@code attempt} (0 for the first retry). */
    public Duration ceiling(int attempt) {
        if (attempt < 0) {
            throw new IllegalArgumentException("attempt must be >= 0");
        }
        double nanos = initialNanos * Math.pow(multiplier, attempt);
        return Duration.ofNanos(nanos >= maxNanos ? maxNanos : (long) nanos);
    }

    /** A delay drawn uniformly from {@code [0, ceiling(attempt))}. */
    public Duration delay(int attempt) {
        long ceiling = ceiling(attempt).toNanos();
        double r = random.getAsDouble();
        if (!(r >= 0.0) || r >= 1.0) {
            throw new IllegalStateException("random source gave " + r + ", outside [0, 1)");
        }
        return Duration.ofNanos((long) (ceiling * r));
    }

    @Override
    public String toString() {
        return "Backoff{initial=" + Duration.ofNanos(initialNanos) + ", max=" + Duration.ofNanos(maxNanos)
                + ", multiplier=" + multiplier + "}";
    }
}
