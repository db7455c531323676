package io.rota.client.channel;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;

/**
 * The calls and the verdict of the conformance steps that change an instance and bound how long
 * it may still be reached: {@code withdraw} (clients/conformance/channel/README.md), {@code drain}
 * and {@code trip} (clients/conformance/xds/README.md). After the change, the runner calls one
 * call after another until at least {@value #CALLS_AFTER} calls started later than
 * {@code within_ms} after it; none of those may reach the instance. Public for the xDS
 * conformance runner (rota-xds-conformance), which uses this test-jar.
 */
public final class CallsAfterChange {
    /** How many calls that started later than {@code within_ms} after the change a step makes, at least. */
    public static final int CALLS_AFTER = 20;
    /**
     * How long past {@code within_ms} a step waits for those calls before it fails (a client whose
     * calls each wait out their deadline), rather than call on for as long as it takes.
     */
    public static final long PATIENCE_MS = 20_000;

    private CallsAfterChange() {
    }

    /**
     * A call of the step: when it started, in nanoseconds after the change, and the instances
     * that received it (none when it failed before reaching one).
     */
    public record Made(long startedNanos, List<String> reached) {
        public Made {
            reached = List.copyOf(reached);
        }
    }

    /** Makes one call and returns the instances that received it. */
    @FunctionalInterface
    public interface Call {
        List<String> make() throws Exception;
    }

    /**
     * Makes calls one after another until at least {@value #CALLS_AFTER} of them started later
     * than {@code withinMs} after {@code changed} (a time of {@code clock}, in nanoseconds), so
     * {@code withinMs} have passed too; gives up once {@link #PATIENCE_MS} more have passed.
     */
    public static List<Made> make(Call call, long changed, long withinMs, LongSupplier clock) throws Exception {
        long within = TimeUnit.MILLISECONDS.toNanos(withinMs);
        long patience = TimeUnit.MILLISECONDS.toNanos(PATIENCE_MS);
        List<Made> made = new ArrayList<>();
        int after = 0;
        while (after < CALLS_AFTER) {
            long started = clock.getAsLong() - changed;
            if (started > within + patience) {
                break;
            }
            made.add(new Made(started, call.make()));
            if (started > within) {
                after++;
            }
        }
        return made;
    }

    /**
     * The step's verdict over its calls: none that started later than {@code withinMs} after
     * {@code what} reached {@code instance}, and at least {@value #CALLS_AFTER} of them did start
     * that late (with fewer, the step would decide nothing).
     */
    public static void check(List<Made> made, String instance, long withinMs, String what) {
        long within = TimeUnit.MILLISECONDS.toNanos(withinMs);
        List<Made> after = made.stream().filter(m -> m.startedNanos() > within).toList();
        List<Long> late = after.stream().filter(m -> m.reached().contains(instance))
                .map(m -> Math.round(m.startedNanos() / 1e6)).toList();
        if (!late.isEmpty()) {
            throw new AssertionError(instance + " still received " + late.size() + " of the " + after.size()
                    + " calls that started later than " + withinMs + " ms after " + what + "; they started these ms after it: "
                    + late.subList(0, Math.min(10, late.size())));
        }
        if (after.size() < CALLS_AFTER) {
            throw new AssertionError("only " + after.size() + " of the " + made.size() + " calls made started later than "
                    + withinMs + " ms after " + what + ", in " + PATIENCE_MS / 1000 + " s more; the step needs " + CALLS_AFTER);
        }
    }

    /**
     * For the test's output: how many calls were made, how many of them started later than
     * {@code withinMs} after the change, and how many of those each instance received.
     */
    public static String summary(List<Made> made, long withinMs) {
        long within = TimeUnit.MILLISECONDS.toNanos(withinMs);
        Map<String, Integer> reached = new TreeMap<>();
        List<Made> after = made.stream().filter(m -> m.startedNanos() > within).toList();
        after.forEach(m -> m.reached().forEach(r -> reached.merge(r, 1, Integer::sum)));
        return made.size() + " calls, " + after.size() + " of them started later than " + withinMs + " ms, reaching " + reached;
    }
}
