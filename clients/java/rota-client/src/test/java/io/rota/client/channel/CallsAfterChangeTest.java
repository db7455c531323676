package io.rota.client.channel;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;

import io.rota.client.channel.CallsAfterChange.Made;

/**
 * The check of the withdraw, drain and trip steps ({@link CallsAfterChange}) on a fake clock,
 * without rota: it fails when the change never takes effect, or only after the bound, or when too
 * few calls start after the bound, and passes when the instance stops being reached in time.
 */
class CallsAfterChangeTest {
    private static final long MS = TimeUnit.MILLISECONDS.toNanos(1);
    /** 1/64 s: 64 calls fill the second up to a bound of 1000 ms exactly. */
    private static final long SIXTY_FOURTH = TimeUnit.SECONDS.toNanos(1) / 64;
    private static final long NEVER = Long.MAX_VALUE;

    /**
     * Consumer 1 of a step on a fake clock: its calls go to echo-a, echo-b and echo-c in turn, each
     * taking {@code takes} ns, until the change takes effect {@code stops} ns after it (then they
     * pass echo-c over), or never ({@link #NEVER}: a DRAINING update that was never sent, a
     * withdrawal never made).
     */
    private static final class Probe {
        final long stops;
        final long takes;
        long now;
        int turn;

        Probe(long stops, long takes) {
            this.stops = stops;
            this.takes = takes;
        }

        List<String> call() {
            List<String> ids = now >= stops ? List.of("echo-a", "echo-b") : List.of("echo-a", "echo-b", "echo-c");
            String reached = ids.get(turn++ % ids.size());
            now += takes;
            return List.of(reached);
        }
    }

    /** The runner's drain of echo-c, acknowledged at time 0 of the probe's clock. */
    private static List<Made> drain(Probe probe) throws Exception {
        List<Made> made = CallsAfterChange.make(probe::call, 0, 1000, () -> probe.now);
        CallsAfterChange.check(made, "echo-c", 1000, "the acknowledgement of its DRAINING");
        return made;
    }

    private static String failure(Probe probe) {
        return assertThrows(AssertionError.class, () -> drain(probe)).getMessage();
    }

    @Test
    void aDrainNeverSentFailsTheStep() {
        // 64 calls (over 20) fill the second up to the bound, the last starting 63/64 s after the
        // change: a step that stopped there saw no call later than the bound.
        String message = failure(new Probe(NEVER, SIXTY_FOURTH));
        assertTrue(message.startsWith("echo-c still received 7 of the 20 calls that started later than 1000 ms after the"
                + " acknowledgement of its DRAINING"), message);
        message = failure(new Probe(NEVER, 100 * MS));
        assertTrue(message.startsWith("echo-c still received "), message);
        assertTrue(message.contains(" of the 20 calls"), message);
    }

    @Test
    void aDrainTakenWithinTheBoundPassesAfter20LateCalls() throws Exception {
        List<Made> made = drain(new Probe(300 * MS, SIXTY_FOURTH));
        assertEquals(20, made.stream().filter(m -> m.startedNanos() > 1000 * MS).count());
        // The step ended with its 20th call after the bound: 64 calls up to 63/64 s, one at 1 s
        // exactly (not later than the bound), then 20.
        assertEquals(64 + 1 + 20, made.size());
        assertTrue(made.stream().anyMatch(m -> m.reached().contains("echo-c")), "the probe reached echo-c before the drain took");
    }

    @Test
    void aDrainTakenAfterTheBoundFails() {
        String message = failure(new Probe(1100 * MS, SIXTY_FOURTH));
        assertTrue(message.startsWith("echo-c still received 2 of the 20 "), message);
        assertTrue(message.endsWith(": [1016, 1063]"), message);
    }

    @Test
    void aStepWhoseCallsAreTooSlowFails() {
        // Calls of 5 s (each waits out its deadline): after the one started at 20 s, the next would
        // start 25 s after the change, past the bound and the patience; 4 calls started after 1 s.
        Probe probe = new Probe(0, TimeUnit.SECONDS.toNanos(5));
        String message = failure(probe);
        assertTrue(message.startsWith("only 4 of the 5 calls made started later than 1000 ms"), message);
        assertTrue(message.endsWith("the step needs 20"), message);
        assertEquals(TimeUnit.SECONDS.toNanos(25), probe.now);
    }

    @Test
    void theCheckCountsOnlyCallsStartedAfterTheBound() {
        List<String> three = List.of("echo-a", "echo-b", "echo-c");
        List<Made> before = new ArrayList<>();
        for (int i = 0; i < 64; i++) {
            before.add(new Made(i * SIXTY_FOURTH, List.of(three.get(i % 3))));
        }
        List<Made> after = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            after.add(new Made(1000 * MS + (i + 1) * SIXTY_FOURTH, List.of(three.get(i % 2))));
        }
        String what = "its withdrawal";
        // Calls before the bound may reach echo-c, and one started at the bound exactly is not late.
        CallsAfterChange.check(concat(before, List.of(new Made(1000 * MS, List.of("echo-c"))), after), "echo-c", 1000, what);
        // What a step that stops once the bound has passed and 20 calls were made in all sees: no
        // call after the bound, which decides nothing.
        assertMessage("only 0 of the 65 calls made started later than 1000 ms",
                concat(before, List.of(new Made(1000 * MS, List.of("echo-a")))), what);
        assertMessage("only 19 of the 83 calls", concat(before, after.subList(0, 19)), what);
        // One late call reaching echo-c fails the step, as does one that reached it among others
        // (a call retried on another instance).
        assertMessage("echo-c still received 1 of the 21 calls that started later than 1000 ms after its withdrawal;"
                + " they started these ms after it: [1500]", concat(before, after, List.of(new Made(1500 * MS, List.of("echo-c")))), what);
        assertMessage("echo-c still received 1 of the 20",
                concat(before, after.subList(0, 19), List.of(new Made(1500 * MS, List.of("echo-c", "echo-a")))), what);
    }

    private static void assertMessage(String starts, List<Made> made, String what) {
        AssertionError error = assertThrows(AssertionError.class, () -> CallsAfterChange.check(made, "echo-c", 1000, what));
        assertTrue(error.getMessage().startsWith(starts), error.getMessage());
    }

    @SafeVarargs
    private static List<Made> concat(List<Made>... parts) {
        List<Made> all = new ArrayList<>();
        for (List<Made> part : parts) {
            all.addAll(part);
        }
        return all;
    }
}
