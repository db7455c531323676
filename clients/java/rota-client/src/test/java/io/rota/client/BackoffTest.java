package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import org.junit.jupiter.api.Test;

class BackoffTest {

    @Test
    void ceilingDoublesFromTheInitialDelayUpToTheCap() {
        List<Long> ceilings = new ArrayList<>();
        for (int attempt = 0; attempt < 10; attempt++) {
            ceilings.add(Backoff.DEFAULT.ceiling(attempt).toMillis());
        }
        assertEquals(List.of(100L, 200L, 400L, 800L, 1600L, 3200L, 6400L, 10_000L, 10_000L, 10_000L), ceilings);
        assertEquals(Duration.ofSeconds(10), Backoff.DEFAULT.ceiling(1000));
    }

    @Test
    void delayIsTheCeilingScaledByTheRandomDraw() {
        Backoff half = Backoff.DEFAULT.withRandom(() -> 0.5);
        assertEquals(Duration.ofMillis(50), half.delay(0));
        assertEquals(Duration.ofMillis(400), half.delay(3));
        assertEquals(Duration.ofMillis(5000), half.delay(12));
        assertEquals(Duration.ZERO, Backoff.DEFAULT.withRandom(() -> 0.0).delay(5));
        Backoff almostOne = Backoff.DEFAULT.withRandom(() -> Math.nextDown(1.0));
        assertEquals(Duration.ofNanos(99_999_999), almostOne.delay(0));
    }

    @Test
    void fullJitterSpansTheWholeRangeAndStaysBelowTheCeiling() {
        Random seeded = new Random(42);
        Backoff backoff = Backoff.DEFAULT.withRandom(seeded::nextDouble);
        for (int attempt = 0; attempt < 12; attempt++) {
            long ceiling = backoff.ceiling(attempt).toNanos();
            long min = Long.MAX_VALUE;
            long max = 0;
            for (int i = 0; i < 500; i++) {
                long delay = backoff.delay(attempt).toNanos();
                assertTrue(delay >= 0 && delay < ceiling, "attempt " + attempt + ": " + delay + " outside [0, " + ceiling + ")");
                min = Math.min(min, delay);
                max = Math.max(max, delay);
            }
            assertTrue(min < ceiling / 20, "attempt " + attempt + " never drew near 0: " + min);
            assertTrue(max > ceiling - ceiling / 20, "attempt " + attempt + " never drew near the ceiling: " + max);
        }
    }

    @Test
    void sameSeedSameDelays() {
        Random a = new Random(7);
        Random b = new Random(7);
        Backoff first = Backoff.DEFAULT.withRandom(a::nextDouble);
        Backoff second = Backoff.DEFAULT.withRandom(b::nextDouble);
        for (int attempt = 0; attempt < 20; attempt++) {
            assertEquals(first.delay(attempt), second.delay(attempt));
        }
    }

    @Test
    void customGrowthAndCap() {
        Backoff backoff = Backoff.exponential(Duration.ofMillis(10), Duration.ofMillis(100)).withMultiplier(3);
        assertEquals(Duration.ofMillis(10), backoff.ceiling(0));
        assertEquals(Duration.ofMillis(30), backoff.ceiling(1));
        assertEquals(Duration.ofMillis(90), backoff.ceiling(2));
        assertEquals(Duration.ofMillis(100), backoff.ceiling(3));
    }

    @Test
    void rejectsBadParametersAndBadRandomSources() {
        assertThrows(IllegalArgumentException.class, () -> Backoff.exponential(Duration.ZERO, Duration.ofSeconds(1)));
        assertThrows(IllegalArgumentException.class, () -> Backoff.exponential(Duration.ofSeconds(2), Duration.ofSeconds(1)));
        assertThrows(IllegalArgumentException.class, () -> Backoff.DEFAULT.withMultiplier(0.5));
        assertThrows(IllegalArgumentException.class, () -> Backoff.DEFAULT.ceiling(-1));
        assertThrows(IllegalStateException.class, () -> Backoff.DEFAULT.withRandom(() -> 1.0).delay(0));
        assertThrows(IllegalStateException.class, () -> Backoff.DEFAULT.withRandom(() -> -0.1).delay(0));
    }
}
