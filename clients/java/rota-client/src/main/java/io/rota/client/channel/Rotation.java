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
 */
final class Rotation {
    private static final System.Logger LOG = System.getLogger(Rotation.class.getName());
    private static final long RETRY_NANOS = TimeUnit.SECONDS.toNanos(1);

    /** What a pick draws. */
    record Draw(Member member, long ticket, String rule, boolean local) {
    }

    /** Outcome of {@link #draw}: a member, a wait for the first lease, or rota's refusal. */
    record Decision(Draw draw, Status failure) {
        static final Decision WAIT = new Decision(null, null);
        static final Decision NONE_USABLE = new Decision(null, Status.OK);
    }

    private final RotaLink link;
    private final String rule;
    private final String version;
    private final Supplier<List<Member>> resolved;
    private final Runnable leased;

    // Guarded by this.
    private final ArrayDeque<long[]> blocks = new ArrayDeque<>();
    private Eligible eligible;
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

    /** The next ticket's instance among those {@code usable} accepts. */
    synchronized Decision draw(Predicate<String> usable) {
        long now = System.nanoTime();
        boolean mayLease = !leasing && (!(outage || refusal != null) || now - retryAt >= 0);
        if (mayLease && blocks.isEmpty()) {
            // The answer can be in before lease returns (then leased ran here, on this thread):
            // what follows reads the state it left, and a pick waits only for a lease in flight.
            lease(now, blockSize);
            mayLease = false;
        }
        if (eligible == null && refusal != null) {
            return new Decision(null, refusal);
        }
        if (blocks.isEmpty()) {
            if (outage) {
                return local(usable);
            }
            waiting = true;
            return Decision.WAIT;
        }
        long ticket = nextTicket();
        drawnSinceLease++;
        if (mayLease && remaining() * 2 <= blockSize) {
            lease(now, blockSize);
        }
        Member member = eligible.map(ticket, null);
        if (member != null && usable.test(member.id())) {
            return new Decision(new Draw(member, ticket, eligible.rule, false), null);
        }
        // Skipped the way rota skips `exclude`: the next ticket, mapped over the usable instances.
        boolean[] excluded = eligible.excluded(usable);
        if (!blocks.isEmpty()) {
            ticket = nextTicket();
            drawnSinceLease++;
        }
        member = eligible.map(ticket, excluded);
        if (member == null) {
            // A lease in flight (a refresh after the instances changed) may list a usable one.
            waiting |= leasing;
            return Decision.NONE_USABLE;
        }
        return new Decision(new Draw(member, ticket, eligible.rule, false), null);
    }

    /** Asks rota for the current eligible list (after the instance list changed). */
    synchronized void refresh() {
        if (eligible == null || outage) {
            return;
        }
        if (leasing) {
            refreshWanted = true;
            return;
        }
        lease(System.nanoTime(), 0);
    }

    /** rota's watch broke: the local rotation from now on, and a lease tried at once. */
    synchronized void lost() {
        if (outage || (eligible == null && resolved.get().isEmpty())) {
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

    private Decision local(Predicate<String> usable) {
        Eligible list = eligible != null ? eligible : Eligible.isolate(resolved.get(), version, rule);
        long turn = localTurn++;
        Member member = list.map(turn, list.excluded(usable));
        return member == null ? Decision.NONE_USABLE : new Decision(new Draw(member, turn, list.rule, true), null);
    }

    private long nextTicket() {
        long[] block = blocks.peekFirst();
        long ticket = block[0]++;
        if (block[0] == block[1]) {
            blocks.pollFirst();
        }
        return ticket;
    }

    private long remaining() {
        long sum = 0;
        for (long[] block : blocks) {
            sum += block[1] - block[0];
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
        link.lease(rule, version, count).whenComplete((response, failure) -> leased(response, failure, asked));
    }

    private void leased(LeaseResponse response, Throwable failure, int asked) {
        boolean notify;
        synchronized (this) {
            leasing = false;
            notify = waiting;
            waiting = false;
            if (failure == null) {
                leases++;
                leasedTickets += response.getCount();
                if (response.getCount() > 0) {
                    blocks.addLast(new long[] {response.getFirstTicket(), response.getFirstTicket() + response.getCount()});
                }
                eligible = new Eligible(response.getInstancesList().stream().map(Rotation::member).toList(), response.getRule());
                refusal = null;
                if (outage) {
                    outage = false;
                    LOG.log(Level.INFO, "rota reachable again: " + link.service + " routed by leased tickets");
                }
                if (refreshWanted) {
                    refreshWanted = false;
                    lease(System.nanoTime(), 0);
                }
            } else if (asked == 0) {
                // A failed refresh of the list: the held tickets stay good, the next refill retries.
                LOG.log(Level.DEBUG, () -> "list refresh of " + link.service + " failed: " + Status.fromThrowable(failure));
            } else {
                retryAt = System.nanoTime() + RETRY_NANOS;
                Status status = Status.fromThrowable(failure);
                if (outage) {
                    // still unreachable: keep the local rotation
                } else if (RotaLink.answeredByRota(failure) && eligible == null) {
                    refusal = status;
                } else if (eligible != null || !resolved.get().isEmpty()) {
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
        return new Member(instance.getId(), instance.getHost(), instance.getPort(), instance.getVersion(),
                instance.hasWeight() ? instance.getWeight() : 100);
    }
}
