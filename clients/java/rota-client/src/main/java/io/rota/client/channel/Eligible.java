package io.rota.client.channel;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.function.Predicate;

/** An eligible list, ordered by id, with the mapping of one rule over it. */
final class Eligible {
    final List<Member> members;
    final String rule;
    final TicketMapping mapping;

    Eligible(List<Member> members, String rule) {
        this.members = List.copyOf(members);
        this.rule = rule;
        this.mapping = TicketMapping.of(rule, members.stream().mapToInt(Member::weight).toArray());
    }

    /**
     * The local stand-in for rota's version isolation over the instances the resolver last saw:
     * the version's instances, else the unversioned ones (what the default {@code fail} fallback
     * allows).
     */
    static Eligible isolate(List<Member> all, String version, String rule) {
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
        return new Eligible(chosen, rule);
    }

    /** Positions whose instance {@code usable} rejects, or null when every one is usable. */
    boolean[] excluded(Predicate<Member> usable) {
        boolean[] excluded = null;
        for (int i = 0; i < members.size(); i++) {
            if (!usable.test(members.get(i))) {
                if (excluded == null) {
                    excluded = new boolean[members.size()];
                }
                excluded[i] = true;
            }
        }
        return excluded;
    }

    /**
     * The member ticket {@code t} goes to: the one it maps to when {@code usable} accepts it,
     * else a usable one chosen by {@link TicketMapping#spread} (the usable members keep the rule's
     * shares among themselves); null when none is usable. Only a ticket whose member is unusable
     * costs a pass over the list.
     */
    Member route(long ticket, Predicate<Member> usable) {
        Member member = map(ticket, null);
        if (member != null && usable.test(member)) {
            return member;
        }
        int index = mapping.spread(ticket, excluded(usable));
        return index < 0 ? null : members.get(index);
    }

    /** The member ticket {@code t} maps to with these exclusions, or null. */
    Member map(long ticket, boolean[] excluded) {
        int index = mapping.map(ticket, excluded);
        return index < 0 ? null : members.get(index);
    }
}
