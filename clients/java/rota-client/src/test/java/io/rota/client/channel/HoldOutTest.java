package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;

/** The hold-out of an instance for timeouts, on a clock the test moves. */
class HoldOutTest {
    private static final long SECOND = TimeUnit.SECONDS.toNanos(1);

    /** Starts near the top of the long range, so that the clock wraps during the test. */
    private long now = Long.MAX_VALUE - 30 * SECOND;
    private final HoldOut hold = new HoldOut(() -> now);

    private void timeouts(int n) {
        for (int i = 0; i < n; i++) {
            hold.timedOut();
        }
    }

    @Test
    void threeTimeoutsInARowHoldTheInstanceOutForTenSeconds() {
        timeouts(2);
        assertFalse(hold.heldOut(), "held out after two timeouts");
        hold.timedOut();
        assertTrue(hold.heldOut());
        now += 10 * SECOND - 1;
        assertTrue(hold.heldOut(), "released before 10 s");
        now += 1;
        assertFalse(hold.heldOut(), "still held out after 10 s");
    }

    @Test
    void timeoutsOfCallsSentBeforeTheHoldDoNotLengthenIt() {
        timeouts(3);
        // Calls that were on their way when the hold began end now.
        timeouts(7);
        now += 10 * SECOND;
        assertFalse(hold.heldOut());
        assertEquals(20 * SECOND, hold.nextHoldNanos(), "the calls of one hold doubled the next one more than once");
    }

    @Test
    void eachFurtherThreeTimeoutsDoubleTheHoldUpToSixtySeconds() {
        long[] holds = {10, 20, 40, 60, 60};
        for (long seconds : holds) {
            timeouts(2);
            assertFalse(hold.heldOut(), "the trial after a hold holds it out again at once");
            hold.timedOut();
            assertTrue(hold.heldOut());
            now += seconds * SECOND - 1;
            assertTrue(hold.heldOut(), "released before " + seconds + " s");
            now += 1;
            assertFalse(hold.heldOut(), "still held out after " + seconds + " s");
        }
    }

    @Test
    void anAnswerEndsTheCountAndBringsTheHoldBackToTenSeconds() {
        timeouts(2);
        hold.answered();
        timeouts(2);
        assertFalse(hold.heldOut(), "an answer between timeouts did not end the count");
        hold.timedOut();
        assertTrue(hold.heldOut());
        now += 10 * SECOND;
        timeouts(3);
        assertTrue(hold.heldOut());
        now += 20 * SECOND;
        assertFalse(hold.heldOut());
        hold.answered();
        assertEquals(10 * SECOND, hold.nextHoldNanos());
        timeouts(3);
        now += 10 * SECOND - 1;
        assertTrue(hold.heldOut());
        now += 1;
        assertFalse(hold.heldOut());
    }

    @Test
    void anAnswerDuringAHoldDoesNotEndIt() {
        timeouts(3);
        // A call sent before the hold that the instance answers late.
        hold.answered();
        assertTrue(hold.heldOut());
        now += 10 * SECOND;
        assertFalse(hold.heldOut());
    }
}
