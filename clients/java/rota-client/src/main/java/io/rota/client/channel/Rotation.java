package io.rota.client.channel;

import java.lang.System.Logger.Level;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.function.Supplier;

import io.grpc.Status;
import io.rota.v1.Instance;
import io.rota.v1.LeaseResponse;
import io.rota.v1.LeasedPick;

/**
 * One rotation of one channel: the tickets leased for (service, rule, version), each with the
 * instance rota mapped it to, and the next lease.
 *
 * <p>Blocks of K consecutive tickets are reserved with {@code Lease}; the next block is asked
 * for when half of what is held is left, so a steady RPC stream never waits for rota. K follows
 * the rate: at each lease it becomes the number of tickets drawn during the last
 * {@value RotaChannels#TARGET_LEASE_INTERVAL_MS} ms, within [{@value RotaChannels#MIN_BLOCK},
 * {@value RotaChannels#MAX_BLOCK}].
 *
 * <p>A lease comes back in one of rota's two shapes, taken as they come: a ticket range
 * ({@code first_ticket + i} goes to {@code instances[positions[i]]}), or {@code picks} (a lease
 * without a version of a service under gray release: each pick names its instance and its own
 * ticket). Either way the channel only indexes rota's answer; it holds no copy of the rules, and
 * takes any rule rota leases. An answer it cannot index (as many positions as tickets, each
 * within the list) is refused like an answer of rota's refusing the lease.
 *
 * <p>A ticket (or pick) whose instance is not usable is passed over, a gap in the shared
 * rotation, and the RPC takes the next one whose instance is usable: the usable instances keep
 * the rule's shares among themselves, and a {@code repeat} run of an unusable instance is skipped
 * whole. Every lease names in {@code exclude} the instances the channel holds unusable
 * ({@link #unusable}), so that rota maps the next block over the others only. When the instance
 * list changes, the unused blocks are dropped and a new block is leased.
 *
 * <p>When rota cannot be reached the rotation goes on locally, logs once, and asks for a lease
 * again at most every second; the first lease that succeeds ends the outage. The local rotation
 * is a plain rotation over the usable instances of the last leased list, one call each in id
 * order (weights and repeat runs are not kept), or, for a rotation rota answered with picks, the
 * last block of picks over again. An answer from rota that refuses the lease (unknown service,
 * no eligible instance, a rule that cannot be leased) fails the RPC when the rotation never had a
 * list, and is treated like an outage when it had one (rota restarted and does not know the
 * instances again yet).
 */
final class Rotation {
    private static final System.Logger LOG = System.getLogger(Rotation.class.getName());
    private static final long RETRY_NANOS = TimeUnit.SECONDS.toNanos(1);
    /** The most ids one {@code Lease} excludes (rota's bound). */
    static final int MAX_EXCLUDE = 1000;

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
    private final Predicate<Member> unusable;

    /**
     * A held lease: its entries {@code next .. size-1} are still to be drawn. Entry {@code i} is
     * ticket {@code first + i} at {@code members[positions[i]]}, or pick {@code i} of
     * {@code picks}; {@code excluded} is what the lease asking for it excluded.
     */
    private static final class Block {
        int next;
        final long first;
        final int[] positions;
        final List<LeasedPick> picks;
        final List<Member> members;
        final List<Member> excluded;
        final String rule;

        Block(long first, int[] positions, List<LeasedPick> picks, List<Member> members, List<Member> excluded, String rule) {
            this.first = first;
            this.positions = positions;
            this.picks = picks;
            this.members = members;
            this.excluded = excluded;
            this.rule = rule;
        }

        int size() {
            return picks != null ? picks.size() : positions.length;
        }

        long ticket(int i) {
            return picks != null ? picks.get(i).getTicket() : first + i;
        }

        /** The instance of entry {@code i}, or null when a pick's position is out of the lease's list. */
        Member member(int i) {
            int position = picks != null ? picks.get(i).getPosition() : positions[i];
            return position >= 0 && position < members.size() ? members.get(position) : null;
        }
    }

    // Guarded by this.
    private final ArrayDeque<Block> blocks = new ArrayDeque<>();
    /** The instances of the last ticket range rota leased, in id order; null when none came yet. */
    private List<Member> lastList;
    private String lastRule;
    /** The last picks block rota sent, kept for the local rotation; null when none came yet. */
    private Block lastPicks;
    /** What the last lease excluded: still named while unusable, until the instance list changes. */
    private List<Member> lastExcluded = List.of();
    /** Whether the last answer with tickets or picks had picks: how the local rotation goes. */
    private boolean picksMode;
    /** Bumped when held blocks are dropped; an answer to a lease asked before is dropped too. */
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

    /**
     * @param resolved the instances the channel was given (the resolver's, or xDS's endpoints)
     * @param leased run when a lease that RPCs wait for is in (they are picked again)
     * @param unusable which instances the channel holds unusable now, named in each lease's {@code exclude}
     */
    Rotation(RotaLink link, String rule, String version, Supplier<List<Member>> resolved, Runnable leased,
            Predicate<Member> unusable) {
        this.link = link;
        this.rule = rule;
        this.version = version;
        this.resolved = resolved;
        this.leased = leased;
        this.unusable = unusable;
    }

    /**
     * The next ticket (or pick) whose instance {@code usable} accepts; those passed over on the
     * way are gaps. Each held block is looked at once at most, and a block leased during the
     * draw once more: when they hold no usable ticket the RPC waits for the next lease.
     */
    synchronized Decision draw(Predicate<Member> usable) {
        long now = System.nanoTime();
        boolean mayLease = !leasing && (!(outage || refusal != null) || now - retryAt >= 0);
        if (mayLease && blocks.isEmpty()) {
            // The answer can be in before lease returns (then leased ran here, on this thread):
            // what follows reads the state it left, and a pick waits only for a lease in flight.
            lease(now);
            mayLease = false;
        }
        if (!listed() && refusal != null) {
            return new Decision(null, refusal);
        }
        for (int round = 0; round < 2 && !blocks.isEmpty(); round++) {
            Block block;
            while ((block = blocks.peekFirst()) != null) {
                if (block.members.stream().noneMatch(usable)) {
                    if (blocks.size() > 1) {
                        // A later block may list a usable instance: this one's tickets are gaps.
                        blocks.pollFirst();
                        continue;
                    }
                    if (!leasing && block.excluded.stream().anyMatch(usable)) {
                        // An instance this block's lease excluded is usable again: a new block.
                        blocks.clear();
                        lease(now);
                        mayLease = false;
                        break;
                    }
                    return noneUsable();
                }
                while (block.next < block.size()) {
                    int i = block.next++;
                    drawnSinceLease++;
                    Member member = block.member(i);
                    if (member != null && usable.test(member)) {
                        if (block.next == block.size()) {
                            blocks.pollFirst();
                        }
                        if (mayLease && remaining() * 2 <= blockSize) {
                            lease(now);
                        }
                        return new Decision(new Draw(member, block.ticket(i), block.rule, false), null);
                    }
                }
                // Only unusable tickets were left: spent; on to the next block.
                blocks.pollFirst();
            }
            if (mayLease) {
                lease(now);
                mayLease = false;
            }
        }
        if (outage) {
            return local(usable);
        }
        waiting = true;
        if (!leasing) {
            // What was leased during this draw held no usable ticket, and no lease is in flight
            // to pick the RPC again: it is picked again (off this pick, which holds the lock),
            // and leases anew.
            try {
                link.scheduler.execute(leased);
            } catch (java.util.concurrent.RejectedExecutionException closed) {
                // the channel is shutting down
            }
        }
        return Decision.WAIT;
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
     * The instance list changed: the held blocks name instances of the old list; they are
     * dropped (gaps in the rotation) and a new block is leased.
     */
    synchronized void refresh() {
        if (!listed() || outage) {
            return;
        }
        blocks.clear();
        lastExcluded = List.of();
        generation++;
        if (leasing) {
            refreshWanted = true;
            return;
        }
        lease(System.nanoTime());
    }

    /** Whether rota ever gave this rotation a list (tickets or picks). */
    private boolean listed() {
        return lastList != null || lastPicks != null;
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

    /**
     * The local rotation: the usable instances of the last leased list (else of the resolver's,
     * isolated by version), one turn each in id order.
     */
    private Decision local(Predicate<Member> usable) {
        if (picksMode && lastPicks != null) {
            return localPick(usable);
        }
        List<Member> list = lastList != null ? lastList : isolate(resolved.get(), version);
        List<Member> up = new ArrayList<>(list.size());
        for (Member m : list) {
            if (usable.test(m)) {
                up.add(m);
            }
        }
        if (up.isEmpty()) {
            return Decision.NONE_USABLE;
        }
        long turn = localTurn++;
        Member member = up.get((int) Long.remainderUnsigned(turn, up.size()));
        return new Decision(new Draw(member, turn, lastList != null ? lastRule : rule, true), null);
    }

    /**
     * The local stand-in for rota's version isolation over the instances the resolver last saw:
     * the version's instances, else the unversioned ones (what the default {@code fail} fallback
     * allows), in id order.
     */
    static List<Member> isolate(List<Member> all, String version) {
        List<Member> chosen = new ArrayList<>();
        for (Member m : all) {
            if (m.version().equals(version)) {
                chosen.add(m);
            }
        }
        if (chosen.isEmpty() && !version.isEmpty()) {
            for (Member m : all) {
                if (m.version().isEmpty()) {
                    chosen.add(m);
                }
            }
        }
        chosen.sort(Comparator.comparing(Member::id));
        return chosen;
    }

    /**
     * The local rotation of a rotation rota last answered with picks: the last block's picks over
     * again, in order, so that the split between versions stays what rota last chose.
     */
    private Decision localPick(Predicate<Member> usable) {
        int n = lastPicks.size();
        for (int tried = 0; tried < n; tried++) {
            long turn = localTurn++;
            Member member = lastPicks.member((int) Long.remainderUnsigned(turn, n));
            if (member != null && usable.test(member)) {
                return new Decision(new Draw(member, turn, lastPicks.rule, true), null);
            }
        }
        return Decision.NONE_USABLE;
    }

    private long remaining() {
        long sum = 0;
        for (Block block : blocks) {
            sum += block.size() - block.next;
        }
        return sum;
    }

    /**
     * The instances to name in a lease's {@code exclude}: of those the channel knows (the
     * resolved ones, the last leased list, the last lease's exclusions), the ones it holds
     * unusable, in id order, at most {@value #MAX_EXCLUDE}.
     */
    private List<Member> toExclude() {
        TreeMap<String, Member> known = new TreeMap<>();
        for (Member m : resolved.get()) {
            known.put(m.id(), m);
        }
        if (lastList != null) {
            lastList.forEach(m -> known.putIfAbsent(m.id(), m));
        }
        if (lastPicks != null) {
            lastPicks.members.forEach(m -> known.putIfAbsent(m.id(), m));
        }
        lastExcluded.forEach(m -> known.putIfAbsent(m.id(), m));
        List<Member> out = new ArrayList<>();
        for (Member m : known.values()) {
            if (unusable.test(m)) {
                out.add(m);
                if (out.size() == MAX_EXCLUDE) {
                    break;
                }
            }
        }
        return out;
    }

    private void lease(long now) {
        if (leasing) {
            return;
        }
        double elapsedMs = Math.max(1, (now - lastLeaseAt) / 1e6);
        long adapted = Math.round(drawnSinceLease * RotaChannels.TARGET_LEASE_INTERVAL_MS / elapsedMs);
        blockSize = (int) Math.max(RotaChannels.MIN_BLOCK, Math.min(RotaChannels.MAX_BLOCK, adapted));
        lastLeaseAt = now;
        drawnSinceLease = 0;
        send(blockSize, toExclude());
    }

    private void send(int count, List<Member> excluded) {
        leasing = true;
        if (outage) {
            link.resetConnectBackoff();
        }
        lastExcluded = excluded;
        long askedIn = generation;
        List<String> ids = excluded.stream().map(Member::id).toList();
        link.lease(rule, version, count, ids).whenComplete((response, failure) -> leased(response, failure, count, excluded, askedIn));
    }

    /** Why rota's answer cannot be indexed, or null when it can. */
    static String unusableAnswer(LeaseResponse response) {
        if (response.getPicksCount() > 0) {
            return null;
        }
        if (response.getPositionsCount() != response.getCount()) {
            return response.getPositionsCount() + " positions for " + response.getCount() + " tickets";
        }
        for (int i = 0; i < response.getPositionsCount(); i++) {
            int position = response.getPositions(i);
            if (Integer.compareUnsigned(position, response.getInstancesCount()) >= 0) {
                return "ticket " + Long.toUnsignedString(response.getFirstTicket() + i) + " at position "
                        + Integer.toUnsignedString(position) + " of a list of " + response.getInstancesCount() + " instances";
            }
        }
        return null;
    }

    private void leased(LeaseResponse response, Throwable failure, int asked, List<Member> excluded, long askedIn) {
        boolean notify;
        synchronized (this) {
            leasing = false;
            if (failure != null && !excluded.isEmpty() && RotaLink.answeredByRota(failure)
                    && Status.fromThrowable(failure).getCode() == Status.Code.UNAVAILABLE) {
                // Every eligible instance excluded (rota refuses that): leased again without exclude,
                // so that the RPCs wait for an instance or fail as when none is usable.
                send(asked, List.of());
                return;
            }
            notify = waiting;
            waiting = false;
            String malformed = failure == null ? unusableAnswer(response) : null;
            if (failure == null && malformed == null) {
                leases++;
                List<Member> members = response.getInstancesList().stream().map(Rotation::member).toList();
                if (response.getPicksCount() > 0) {
                    // rota mapped these itself: each pick names its instance and its own ticket.
                    leasedTickets += response.getPicksCount();
                    picksMode = true;
                    Block block = new Block(0, null, List.copyOf(response.getPicksList()), members, excluded, response.getRule());
                    lastPicks = block;
                    if (askedIn == generation) {
                        blocks.addLast(block);
                    }
                } else {
                    leasedTickets += response.getCount();
                    picksMode = false;
                    lastList = members;
                    lastRule = response.getRule();
                    if (response.getCount() > 0 && askedIn == generation) {
                        int[] positions = response.getPositionsList().stream().mapToInt(Integer::intValue).toArray();
                        blocks.addLast(new Block(response.getFirstTicket(), positions, null, members, excluded, response.getRule()));
                    }
                }
                refusal = null;
                if (outage) {
                    outage = false;
                    LOG.log(Level.INFO, "rota reachable again: " + link.service + " routed by leased tickets");
                }
                if (refreshWanted) {
                    refreshWanted = false;
                    lease(System.nanoTime());
                }
            } else {
                retryAt = System.nanoTime() + RETRY_NANOS;
                Status status = failure != null ? Status.fromThrowable(failure)
                        : Status.INTERNAL.withDescription("rota's lease of " + link.service + " cannot be used: " + malformed);
                boolean byRota = failure == null || RotaLink.answeredByRota(failure);
                if (outage) {
                    // still unreachable: keep the local rotation
                } else if (byRota && !listed()) {
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
