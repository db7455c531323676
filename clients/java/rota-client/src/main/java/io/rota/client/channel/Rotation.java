package io.rota.client.channel;

import java.lang.System.Logger.Level;
import java.util.ArrayDeque;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.function.Supplier;

import io.grpc.Status;
import io.rota.v1.Instance;
import io.rota.v1.LeaseResponse;
import io.rota.v1.LeasedPick;

/**
 * One rotation of one channel: the tickets leased for (service, rule, version), the eligible list
 * they map over, and the next lease.
 *
 * <p>Blocks of K consecutive tickets are reserved with {@code Lease}; the next block is asked
 * for when half of what is held is left, so a steady RPC stream never waits for rota. K follows
 * the rate: at each lease it becomes the number of tickets drawn during the last
 * {@value RotaChannels#TARGET_LEASE_INTERVAL_MS} ms, within [{@value RotaChannels#MIN_BLOCK},
 * {@value RotaChannels#MAX_BLOCK}].
 *
 * <p>When rota cannot be reached the rotation goes on locally over the last eligible list (a
 * local counter, the same rule), logs once, and asks for a lease again at most every second;
 * the first lease that succeeds ends the outage. An answer from rota that refuses the lease
 * (unknown service, no eligible instance, a rule that cannot be leased) fails the RPC when the
 * rotation never had a list, and is treated like an outage when it had one (rota restarted and
 * does not know the instances again yet).
 *
 * <p>A lease can come back in either of rota's two shapes, and the rotation takes both without
 * knowing in advance which one a service uses: a ticket range mapped here over the eligible list,
 * or {@code picks} that rota mapped itself (a lease without a version of a service under gray
 * release, whose version rota chooses per pick). A ticket whose instance is not usable goes to a
 * usable one ({@link Eligible#route}). Picks are used in order; a pick whose instance is not
 * usable is skipped (a gap) for the next pick of the block. When the instance list
 * changes, the unused picks are dropped and a new block is leased.
 */
final class Rotation {
    private static final System.Logger LOG = System.getLogger(Rotation.class.getName());
    private static final long RETRY_NANOS = TimeUnit.SECONDS.toNanos(1);

    /** What a pick draws. */
    record Draw(Member member, long ticket, String rule, boolean local) {
    }

    /**
     * Outcome of {@link #draw}: a member, a wait for a lease in flight ({@link #WAIT}: the RPC is
     * picked again when it is in), no usable instance ({@link #NONE_USABLE}), or rota's refusal.
     */
    record Decision(Draw draw, Status failure) {
        static final Decision WAIT = new Decision(null, null);
        static final Decision NONE_USABLE = new Decision(null, Status.OK);
    }

    private final RotaLink link;
    private final String rule;
    private final String version;
    private final Supplier<List<Member>> resolved;
    private final Runnable leased;

    /**
     * Held leases, oldest first: tickets {@code next .. end-1} of a ticket range, or the picks
     * {@code next .. end-1} of a lease rota mapped itself (then {@code picks} and {@code members}).
     */
    private static final class Block {
        long next;
        final long end;
        final List<LeasedPick> picks;
        final List<Member> members;
        final String rule;

        Block(long first, long end) {
            this.next = first;
            this.end = end;
            this.picks = null;
            this.members = null;
            this.rule = null;
        }

        Block(List<LeasedPick> picks, List<Member> members, String rule) {
            this.next = 0;
            this.end = picks.size();
            this.picks = picks;
            this.members = members;
            this.rule = rule;
        }

        boolean isPicks() {
            return picks != null;
        }

        /** The instance of pick {@code i}, or null when its position is out of the lease's list. */
        Member member(int i) {
            int position = picks.get(i).getPosition();
            return position >= 0 && position < members.size() ? members.get(position) : null;
        }
    }

    // Guarded by this.
    private final ArrayDeque<Block> blocks = new ArrayDeque<>();
    /** The list ticket ranges map over (the last ticket-shaped answer's). */
    private Eligible eligible;
    /** The last picks block rota sent, kept for the local rotation; null when none came yet. */
    private Block lastPicks;
    /** Whether the last answer with tickets or picks had picks: how the next refresh asks. */
    private boolean picksMode;
    /** Bumped when held picks are dropped; a picks answer to a lease asked before is dropped too. */
    private long generation;
    private boolean leasing;
    private boolean refreshWanted;
    private boolean outage;
    private boolean waiting;
    private Status refusal;
    private long retryAt;
    private long localTurn;
    private int blockSize = RotaChannels.MIN_BLOCK;
    private long lastLeaseAt = System.nanoTime();
    private long drawnSinceLease;
    private long leases;
    private long leasedTickets;

    Rotation(RotaLink link, String rule, String version, Supplier<List<Member>> resolved, Runnable leased) {
        this.link = link;
        this.rule = rule;
        this.version = version;
        this.resolved = resolved;
        this.leased = leased;
    }

    /**
     * The next ticket and its instance: the one the ticket maps to, or when {@code usable} rejects
     * that one, the usable instance {@link Eligible#route} spreads the ticket to.
     */
    synchronized Decision draw(Predicate<Member> usable) {
        long now = System.nanoTime();
        boolean mayLease = !leasing && (!(outage || refusal != null) || now - retryAt >= 0);
        if (mayLease && blocks.isEmpty()) {
            // The answer can be in before lease returns (then leased ran here, on this thread):
            // what follows reads the state it left, and a pick waits only for a lease in flight.
            lease(now, blockSize);
            mayLease = false;
        }
        if (!listed() && refusal != null) {
            return new Decision(null, refusal);
        }
        if (blocks.isEmpty()) {
            if (outage) {
                return local(usable);
            }
            waiting = true;
            return Decision.WAIT;
        }
        if (blocks.peekFirst().isPicks()) {
            return drawPick(usable, now, mayLease);
        }
        long ticket = nextTicket();
        drawnSinceLease++;
        if (mayLease && remaining() * 2 <= blockSize) {
            lease(now, blockSize);
        }
        // A ticket whose instance is unusable goes to a usable one, the same ticket (not the next).
        Member member = eligible.route(ticket, usable);
        if (member == null) {
            return noneUsable();
        }
        return new Decision(new Draw(member, ticket, eligible.rule, false), null);
    }

    /**
     * No listed instance is usable: a lease in flight (a refresh after the instances changed) may
     * list a usable one, and then the pick waits for it; else the picker decides.
     */
    private Decision noneUsable() {
        if (leasing) {
            waiting = true;
            return Decision.WAIT;
        }
        return Decision.NONE_USABLE;
    }

    /**
     * The next pick of the picks block at the head whose instance {@code usable} accepts; the
     * picks skipped on the way are gaps. A block none of whose instances is usable is left as it
     * is (the RPC waits for a subchannel, or for the new block an instance change brings).
     */
    private Decision drawPick(Predicate<Member> usable, long now, boolean mayLease) {
        Block block;
        while ((block = blocks.peekFirst()) != null && block.isPicks()) {
            if (block.members.stream().noneMatch(usable)) {
                return noneUsable();
            }
            while (block.next < block.end) {
                int i = (int) block.next++;
                drawnSinceLease++;
                Member member = block.member(i);
                if (member != null && usable.test(member)) {
                    if (block.next == block.end) {
                        blocks.pollFirst();
                    }
                    if (mayLease && remaining() * 2 <= blockSize) {
                        lease(now, blockSize);
                    }
                    return new Decision(new Draw(member, block.picks.get(i).getTicket(), block.rule, false), null);
                }
            }
            // Only unusable picks were left: spent; on to the next block.
            blocks.pollFirst();
        }
        if (mayLease && remaining() * 2 <= blockSize) {
            lease(now, blockSize);
        }
        if (!blocks.isEmpty()) {
            // A ticket range follows (the service left gray release), or the lease just asked
            // for is already in.
            return draw(usable);
        }
        if (outage) {
            return local(usable);
        }
        waiting = true;
        return Decision.WAIT;
    }

    /**
     * The instance list changed: asks rota for the current eligible list. Held picks name
     * instances of the old list; they are dropped (gaps in their rotations) and a new block is
     * leased.
     */
    synchronized void refresh() {
        if (!listed() || outage) {
            return;
        }
        if (picksMode || blocks.stream().anyMatch(Block::isPicks)) {
            blocks.removeIf(Block::isPicks);
            generation++;
        }
        if (leasing) {
            refreshWanted = true;
            return;
        }
        lease(System.nanoTime(), picksMode ? blockSize : 0);
    }

    /** Whether rota ever gave this rotation a list (tickets or picks). */
    private boolean listed() {
        return eligible != null || lastPicks != null;
    }

    /** rota's watch broke: the local rotation from now on, and a lease tried at once. */
    synchronized void lost() {
        if (outage || (!listed() && resolved.get().isEmpty())) {
            return;
        }
        outage = true;
        blocks.clear();
        retryAt = System.nanoTime();
    }

    synchronized boolean inOutage() {
        return outage;
    }

    /** Leases and tickets leased so far. */
    synchronized long[] leaseCounts() {
        return new long[] {leases, leasedTickets};
    }

    private Decision local(Predicate<Member> usable) {
        if (picksMode && lastPicks != null) {
            return localPick(usable);
        }
        Eligible list = eligible != null ? eligible : Eligible.isolate(resolved.get(), version, rule);
        long turn = localTurn++;
        Member member = list.route(turn, usable);
        return member == null ? Decision.NONE_USABLE : new Decision(new Draw(member, turn, list.rule, true), null);
    }

    /**
     * The local rotation of a rotation rota last answered with picks: the last block's picks over
     * again, in order, so that the split between versions stays what rota last chose.
     */
    private Decision localPick(Predicate<Member> usable) {
        int n = lastPicks.picks.size();
        for (int tried = 0; tried < n; tried++) {
            long turn = localTurn++;
            Member member = lastPicks.member((int) Long.remainderUnsigned(turn, n));
            if (member != null && usable.test(member)) {
                return new Decision(new Draw(member, turn, lastPicks.rule, true), null);
            }
        }
        return Decision.NONE_USABLE;
    }

    private long nextTicket() {
        Block block = blocks.peekFirst();
        long ticket = block.next++;
        if (block.next == block.end) {
            blocks.pollFirst();
        }
        return ticket;
    }

    private long remaining() {
        long sum = 0;
        for (Block block : blocks) {
            sum += block.end - block.next;
        }
        return sum;
    }

    private void lease(long now, int wanted) {
        if (leasing) {
            return;
        }
        int count = wanted;
        if (wanted > 0) {
            double elapsedMs = Math.max(1, (now - lastLeaseAt) / 1e6);
            long adapted = Math.round(drawnSinceLease * RotaChannels.TARGET_LEASE_INTERVAL_MS / elapsedMs);
            blockSize = (int) Math.max(RotaChannels.MIN_BLOCK, Math.min(RotaChannels.MAX_BLOCK, adapted));
            count = blockSize;
            lastLeaseAt = now;
            drawnSinceLease = 0;
        }
        leasing = true;
        if (outage) {
            link.resetConnectBackoff();
        }
        int asked = count;
        long askedIn = generation;
        link.lease(rule, version, count).whenComplete((response, failure) -> leased(response, failure, asked, askedIn));
    }

    private void leased(LeaseResponse response, Throwable failure, int asked, long askedIn) {
        boolean notify;
        synchronized (this) {
            leasing = false;
            notify = waiting;
            waiting = false;
            if (failure == null) {
                leases++;
                List<Member> members = response.getInstancesList().stream().map(Rotation::member).toList();
                if (response.getPicksCount() > 0) {
                    // rota mapped these itself: each pick names its instance and its own ticket.
                    leasedTickets += response.getPicksCount();
                    picksMode = true;
                    Block block = new Block(List.copyOf(response.getPicksList()), members, response.getRule());
                    lastPicks = block;
                    if (askedIn == generation) {
                        blocks.addLast(block);
                    }
                } else {
                    leasedTickets += response.getCount();
                    if (response.getCount() > 0) {
                        picksMode = false;
                        blocks.addLast(new Block(response.getFirstTicket(), response.getFirstTicket() + response.getCount()));
                    }
                    // A list-only answer (count 0) of a rotation in picks mode says nothing of the
                    // ticket list; one with tickets, or of a ticket rotation, is the list they map over.
                    if (response.getCount() > 0 || !picksMode) {
                        eligible = new Eligible(members, response.getRule());
                    }
                }
                refusal = null;
                if (outage) {
                    outage = false;
                    LOG.log(Level.INFO, "rota reachable again: " + link.service + " routed by leased tickets");
                }
                if (refreshWanted) {
                    refreshWanted = false;
                    lease(System.nanoTime(), picksMode ? blockSize : 0);
                }
            } else if (asked == 0) {
                // A failed refresh of the list: the held tickets stay good, the next refill retries.
                LOG.log(Level.DEBUG, () -> "list refresh of " + link.service + " failed: " + Status.fromThrowable(failure));
            } else {
                retryAt = System.nanoTime() + RETRY_NANOS;
                Status status = Status.fromThrowable(failure);
                if (outage) {
                    // still unreachable: keep the local rotation
                } else if (RotaLink.answeredByRota(failure) && !listed()) {
                    refusal = status;
                } else if (listed() || !resolved.get().isEmpty()) {
                    outage = true;
                    // Tickets of a rota that may have restarted (a new counter): the local
                    // rotation takes over until a lease succeeds.
                    blocks.clear();
                    LOG.log(Level.WARNING, "rota at " + link.server + " refused or unreachable (" + status.getCode()
                            + (status.getDescription() != null ? ": " + status.getDescription() : "")
                            + "); routing " + link.service + " by a local rotation over the last known instances");
                } else {
                    refusal = status;
                }
            }
        }
        if (notify) {
            leased.run();
        }
    }

    private static Member member(Instance instance) {
        return new Member(instance.getId(), Member.canonicalHost(instance.getHost()), instance.getPort(), instance.getVersion(),
                instance.hasWeight() ? instance.getWeight() : 100);
    }
}
