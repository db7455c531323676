package io.rota.client.channel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.PriorityQueue;

/**
 * The ticket → instance mapping of the leasable rules, the same arithmetic rota runs for a pick
 * (docs/rules.md), over an eligible list ordered by instance id.
 *
 * <ul>
 *   <li>{@code round_robin}: position {@code t mod n};</li>
 *   <li>{@code repeat(n=k)}: position {@code (t / k) mod n};</li>
 *   <li>{@code weighted}: slot {@code t mod Σw} of an earliest-deadline-first schedule of the
 *       weights reduced by their gcd (instance i's j-th slot due at {@code (2j+1)/2wᵢ}).</li>
 * </ul>
 *
 * <p>Excluded positions are skipped the way rota skips a pick's {@code exclude}: the rotating
 * rules rotate over the accepted positions, {@code weighted} walks its schedule from slot
 * {@code t mod Σw} to the first accepted instance. Tickets are unsigned 64-bit numbers.
 *
 * <p>A channel maps a ticket whose instance it cannot use with {@link #spread}: the same ticket
 * goes to a usable instance, so that the usable ones keep the rule's shares among themselves
 * (docs/channels.md, "Instances the channel cannot use").
 */
final class TicketMapping {
    /** Longest weighted schedule; larger weight sums are scaled down (rota's bound). */
    static final long MAX_CYCLE = 1L << 20;

    enum Kind { ROUND_ROBIN, REPEAT, WEIGHTED }

    private final Kind kind;
    private final long repeat;
    private final int[] weights;
    private int[] slots;
    /** The slots of the last unusable set {@link #spread} saw; replaced when the set changes. */
    private volatile Spread spread;

    /** The cycle's slots split by an unusable set: {@code down} and {@code up}, each in slot order. */
    private record Spread(boolean[] unusable, int[] down, int[] up) {
    }

    private TicketMapping(Kind kind, long repeat, int[] weights) {
        this.kind = kind;
        this.repeat = repeat;
        this.weights = weights;
    }

    /**
     * The mapping of {@code rule} (canonical or short form: {@code round_robin}, {@code repeat},
     * {@code repeat(n=5)}, {@code weighted}) over instances with these weights.
     *
     * @throws IllegalArgumentException for a rule that cannot be leased
     */
    static TicketMapping of(String rule, int[] weights) {
        String r = rule.replace(" ", "");
        if (r.equals("round_robin") || r.isEmpty()) {
            return new TicketMapping(Kind.ROUND_ROBIN, 1, weights);
        }
        if (r.equals("weighted")) {
            return new TicketMapping(Kind.WEIGHTED, 1, weights);
        }
        if (r.equals("repeat")) {
            return new TicketMapping(Kind.REPEAT, 3, weights);
        }
        if (r.startsWith("repeat(n=") && r.endsWith(")")) {
            try {
                long n = Long.parseLong(r.substring("repeat(n=".length(), r.length() - 1));
                return new TicketMapping(Kind.REPEAT, Math.max(1, n), weights);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("bad repeat rule " + rule, e);
            }
        }
        throw new IllegalArgumentException("rule " + rule + " cannot be leased; leasable rules: round_robin, repeat, weighted");
    }

    /** Whether {@code rule} names a leasable rule ({@code ""} is the service's policy rule). */
    static boolean leasable(String rule) {
        try {
            of(rule, new int[0]);
            return true;
        } catch (IllegalArgumentException e) {
            return false;
        }
    }

    Kind kind() {
        return kind;
    }

    int size() {
        return weights.length;
    }

    /** The position ticket {@code t} maps to, or -1 when no instance is accepted. */
    int map(long ticket, boolean[] excluded) {
        int n = weights.length;
        int accepted = n;
        if (excluded != null) {
            for (int i = 0; i < n; i++) {
                if (excluded[i]) {
                    accepted--;
                }
            }
        }
        if (accepted <= 0) {
            return -1;
        }
        return switch (kind) {
            case ROUND_ROBIN -> nthAccepted(Long.remainderUnsigned(ticket, accepted), excluded);
            case REPEAT -> nthAccepted(Long.remainderUnsigned(Long.divideUnsigned(ticket, repeat), accepted), excluded);
            case WEIGHTED -> weighted(ticket, excluded);
        };
    }

    /**
     * The position ticket {@code t} goes to when some positions are {@code unusable} (null: none).
     * With the rule's cycle of slots {@code S} (the positions for {@code round_robin} and
     * {@code repeat(n=r)}, the weighted schedule's slots for {@code weighted}), the unit
     * {@code u} ({@code t}, or {@code t / r} for {@code repeat}), the cycle {@code j = u / |S|},
     * the unusable slots {@code D} and the usable slots {@code A} (each in slot order), and
     * {@code i} the rank of slot {@code u mod |S|} among {@code D}: the instance of slot
     * {@code A[(j·|D| + i) mod |A|]}. A ticket whose own slot is usable keeps it. Over {@code |A|}
     * cycles each usable slot takes exactly {@code |D|} of the unusable slots' tickets, and the
     * tickets of one {@code repeat} run stay together. -1 when no slot is usable.
     *
     * <p>The split of the slots is kept for the last unusable set, so that only a change of the
     * set costs a pass over the cycle.
     */
    int spread(long ticket, boolean[] unusable) {
        int[] schedule = kind == Kind.WEIGHTED ? schedule() : null;
        int size = schedule != null ? schedule.length : weights.length;
        if (size == 0) {
            return -1;
        }
        long unit = kind == Kind.REPEAT ? Long.divideUnsigned(ticket, repeat) : ticket;
        int slot = (int) Long.remainderUnsigned(unit, size);
        if (unusable == null) {
            return schedule != null ? schedule[slot] : slot;
        }
        Spread split = split(unusable, schedule, size);
        int rank = Arrays.binarySearch(split.down, slot);
        if (rank < 0) {
            return schedule != null ? schedule[slot] : slot;
        }
        int[] up = split.up;
        if (up.length == 0) {
            return -1;
        }
        long cycle = Long.divideUnsigned(unit, size);
        // (j·|D| + i) mod |A| without overflow: |A| and |D| are at most 2^20.
        long index = (Long.remainderUnsigned(cycle, up.length) * split.down.length + rank) % up.length;
        int chosen = up[(int) index];
        return schedule != null ? schedule[chosen] : chosen;
    }

    private Spread split(boolean[] unusable, int[] schedule, int size) {
        Spread split = spread;
        if (split != null && Arrays.equals(split.unusable, unusable)) {
            return split;
        }
        int[] down = new int[size];
        int[] up = new int[size];
        int downs = 0;
        int ups = 0;
        for (int s = 0; s < size; s++) {
            int position = schedule != null ? schedule[s] : s;
            if (position < unusable.length && unusable[position]) {
                down[downs++] = s;
            } else {
                up[ups++] = s;
            }
        }
        split = new Spread(unusable.clone(), Arrays.copyOf(down, downs), Arrays.copyOf(up, ups));
        spread = split;
        return split;
    }

    private static int nthAccepted(long nth, boolean[] excluded) {
        if (excluded == null) {
            return (int) nth;
        }
        long seen = -1;
        for (int i = 0; i < excluded.length; i++) {
            if (!excluded[i] && ++seen == nth) {
                return i;
            }
        }
        return -1;
    }

    private int weighted(long ticket, boolean[] excluded) {
        int[] schedule = schedule();
        if (schedule.length == 0) {
            return -1;
        }
        int start = (int) Long.remainderUnsigned(ticket, schedule.length);
        for (int step = 0; step < schedule.length; step++) {
            int index = schedule[(start + step) % schedule.length];
            if (excluded == null || !excluded[index]) {
                return index;
            }
        }
        return -1;
    }

    /** The weighted schedule, built on first use (one per eligible list, as rota does per snapshot). */
    synchronized int[] schedule() {
        if (slots == null) {
            slots = build(weights);
        }
        return slots;
    }

    static int[] build(int[] weights) {
        long[] reduced = normalize(weights);
        record Slot(long numerator, long weight, int index) {
        }
        // Earliest deadline first: the smallest numerator/weight, ties to the lower position.
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
            long next = slot.numerator + 2;
            if (next < 2 * slot.weight) {
                heap.add(new Slot(next, slot.weight, slot.index));
            }
        }
        return slots.stream().mapToInt(Integer::intValue).toArray();
    }

    private static long[] normalize(int[] weights) {
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
            if (reduced[i] > 0) {
                nonzero++;
            }
        }
        if (total > MAX_CYCLE) {
            long budget = Math.max(1, MAX_CYCLE - nonzero);
            for (int i = 0; i < reduced.length; i++) {
                if (reduced[i] > 0) {
                    // weight < 2^32 and budget <= 2^20: the product fits in a long.
                    reduced[i] = 1 + reduced[i] * budget / total;
                }
            }
        }
        return reduced;
    }

    private static long gcd(long a, long b) {
        return b == 0 ? a : gcd(b, a % b);
    }
}
