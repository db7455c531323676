package io.rota.client.channel;

import java.util.ArrayList;
import java.util.List;
import java.util.PriorityQueue;

/**
 * The test oracle of the channel scenarios' {@code rotation} expectation: where rota's leasable
 * rules send ticket {@code t} over an eligible list in id order (docs/rules.md). The channel has
 * no copy of the rules (it indexes rota's positions); this is the spec the runner checks rota's
 * rotation against, and {@link RuleOracleTest} checks it against rota's own positions.
 *
 * <ul>
 *   <li>{@code round_robin}: position {@code t mod n};</li>
 *   <li>{@code repeat(n=k)} ({@code repeat}: k = 3): position {@code (t / k) mod n};</li>
 *   <li>{@code weighted}: slot {@code t mod Σw} of the earliest-deadline-first schedule of the
 *       weights reduced by their gcd (instance i's j-th slot due at {@code (2j+1)/2wᵢ}, ties to
 *       the lower position), scaled down past 2²⁰ slots.</li>
 * </ul>
 */
final class RuleOracle {
    static final long MAX_CYCLE = 1L << 20;

    private final String rule;
    private final long repeat;
    private final int[] schedule;
    private final int size;

    RuleOracle(String rule, int[] weights) {
        String r = rule.replace(" ", "");
        this.rule = r;
        this.size = weights.length;
        if (r.equals("round_robin") || r.isEmpty()) {
            repeat = 1;
            schedule = null;
        } else if (r.equals("weighted")) {
            repeat = 1;
            schedule = schedule(weights);
        } else if (r.equals("repeat")) {
            repeat = 3;
            schedule = null;
        } else if (r.startsWith("repeat(n=") && r.endsWith(")")) {
            repeat = Math.max(1, Long.parseLong(r.substring("repeat(n=".length(), r.length() - 1)));
            schedule = null;
        } else {
            throw new IllegalArgumentException("the oracle knows round_robin, repeat(n=N) and weighted, not " + rule);
        }
    }

    /** The position ticket {@code t} (unsigned) goes to. */
    int position(long ticket) {
        if (schedule != null) {
            return schedule[(int) Long.remainderUnsigned(ticket, schedule.length)];
        }
        return (int) Long.remainderUnsigned(Long.divideUnsigned(ticket, repeat), size);
    }

    @Override
    public String toString() {
        return rule + " over " + size;
    }

    static int[] schedule(int[] weights) {
        long divisor = 0;
        for (int w : weights) {
            if (w > 0) {
                divisor = gcd(divisor, Integer.toUnsignedLong(w));
            }
        }
        divisor = Math.max(divisor, 1);
        long[] reduced = new long[weights.length];
        long total = 0;
        int nonzero = 0;
        for (int i = 0; i < weights.length; i++) {
            reduced[i] = Integer.toUnsignedLong(weights[i]) / divisor;
            total += reduced[i];
            nonzero += reduced[i] > 0 ? 1 : 0;
        }
        if (total > MAX_CYCLE) {
            long budget = Math.max(1, MAX_CYCLE - nonzero);
            for (int i = 0; i < reduced.length; i++) {
                if (reduced[i] > 0) {
                    reduced[i] = 1 + reduced[i] * budget / total;
                }
            }
        }
        record Slot(long numerator, long weight, int index) {
        }
        PriorityQueue<Slot> heap = new PriorityQueue<>((a, b) -> {
            int byDeadline = Long.compare(a.numerator * b.weight, b.numerator * a.weight);
            return byDeadline != 0 ? byDeadline : Integer.compare(a.index, b.index);
        });
        for (int i = 0; i < reduced.length; i++) {
            if (reduced[i] > 0) {
                heap.add(new Slot(1, reduced[i], i));
            }
        }
        List<Integer> slots = new ArrayList<>();
        Slot slot;
        while ((slot = heap.poll()) != null) {
            slots.add(slot.index);
            if (slot.numerator + 2 < 2 * slot.weight) {
                heap.add(new Slot(slot.numerator + 2, slot.weight, slot.index));
            }
        }
        return slots.stream().mapToInt(Integer::intValue).toArray();
    }

    private static long gcd(long a, long b) {
        return b == 0 ? a : gcd(b, a % b);
    }
}
