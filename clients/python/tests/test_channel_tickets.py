"""The channels' rotation fed ticket-range leases (``LeaseResponse.positions``), without a server:
each ticket goes to the instance its position names, an unusable instance's tickets are passed
over (the call takes the next ticket), leases name the unusable instances in ``exclude``, and
while rota is unreachable a plain local rotation takes over. The fake answers carry positions
the way rota computes them (rule_oracle.py), or positions no rule gives, which must be followed
all the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from rota._pb import rota_pb2 as pb
from rota._router import lease_of
from rota._tickets import (
    MAX_EXCLUDE,
    NONE_USABLE,
    WAIT,
    Draw,
    Lease,
    Member,
    Refused,
    Rotation,
    UnusableLease,
    excluded_ids,
)
from rule_oracle import positions

A = Member("echo-a", "127.0.0.1", 9001)
B = Member("echo-b", "127.0.0.1", 9002)
C = Member("echo-c", "127.0.0.1", 9003)
V = Member("echo-v", "127.0.0.1", 9004, version="v2")
ABC = [A, B, C]


def everyone(_: str) -> bool:
    return True


def not_c(member_id: str) -> bool:
    return member_id != C.id


def lease(first: int, count: int, rule: str = "round_robin", members: list[Member] = ABC) -> Lease:  # noqa: B006
    """A ticket range as rota positions it over ``members`` (their weights)."""
    return Lease(first, count, members, rule, positions(rule, [m.weight for m in members], first, count))


def rotation(rule: str = "round_robin", version: str = "", known: list[Member] = ABC) -> Rotation:  # noqa: B006
    """A fresh rotation that has asked for its first lease."""
    r = Rotation(rule, version, lambda: list(known))
    decision, count = r.draw(everyone)
    assert decision == WAIT and count is not None
    return r


def drawn(r: Rotation, usable: Callable[[str], bool] = everyone) -> Draw:
    decision, _ = r.draw(usable)
    assert isinstance(decision, Draw), decision
    return decision


def calls(r: Rotation, n: int, usable: Callable[[str], bool] = everyone) -> list[tuple[str, int]]:
    """The next n calls' instances (their last letter) and tickets."""
    return [(d.member.id[-1], d.ticket) for d in (drawn(r, usable) for _ in range(n))]


def test_each_ticket_goes_to_the_position_rota_sent() -> None:
    # Positions no rule gives over three instances (not t mod 3): followed exactly.
    r = rotation()
    r.leased(Lease(40, 6, ABC, "round_robin", [2, 2, 0, 1, 0, 2]))
    draws = [drawn(r) for _ in range(6)]
    assert [(d.member, d.ticket) for d in draws] == [(C, 40), (C, 41), (A, 42), (B, 43), (A, 44), (C, 45)]
    assert all(d.rule == "round_robin" and not d.local for d in draws)
    assert r.draw(everyone)[0] == WAIT, "a spent block is not used again"


def test_lease_of_reads_the_positions_of_a_ticket_range() -> None:
    response = pb.LeaseResponse(
        first_ticket=7,
        count=3,
        instances=[pb.Instance(service="echo", id=m.id, host=m.host, port=m.port) for m in ABC],
        rule="repeat(n=2)",
        positions=[1, 1, 0],
    )
    r = rotation()
    r.leased(lease_of(response))
    assert calls(r, 3) == [("b", 7), ("b", 8), ("a", 9)]


def test_any_rule_rota_leases_is_taken_and_reported() -> None:
    r = rotation("least_surprise")
    r.leased(Lease(0, 2, [A, B], "least_surprise(k=2)", [1, 0]))
    draws = [drawn(r) for _ in range(2)]
    assert [d.member for d in draws] == [B, A] and {d.rule for d in draws} == {"least_surprise(k=2)"}


@pytest.mark.parametrize(
    ("positions_", "message"),
    [
        ([0, 1], "2 positions for 3 tickets"),
        ([0, 1, 2, 0], "4 positions for 3 tickets"),
        ([0, 3, 1], "ticket 11 to position 3, past its 3 instances"),
    ],
)
def test_an_answer_whose_positions_do_not_fit_is_refused(positions_: list[int], message: str) -> None:
    response = pb.LeaseResponse(
        first_ticket=10,
        count=3,
        instances=[pb.Instance(service="echo", id=m.id, host=m.host, port=m.port) for m in ABC],
        rule="round_robin",
        positions=positions_,
    )
    with pytest.raises(UnusableLease, match=message):
        lease_of(response)


def test_no_positions_are_needed_for_no_tickets_nor_for_picks() -> None:
    assert Lease(0, 0, ABC, "round_robin").count == 0
    assert Lease(0, 2, ABC, "round_robin", picks=[(4, A), (5, B)]).picks == [(4, A), (5, B)]


def test_round_robin_an_unusable_instances_tickets_are_passed_over() -> None:
    # Three cycles of round robin over a, b, c; c cannot take calls: its tickets are consumed,
    # never sent, and a and b keep equal shares.
    r = rotation()
    r.leased(lease(0, 18))
    got = calls(r, 12, not_c)
    assert got == [("ab"[k % 2], t) for k, t in enumerate(t for t in range(18) if t % 3 != 2)]
    assert Counter(i for i, _ in got) == {"a": 6, "b": 6}
    assert r.skipped_tickets == 5, "c's tickets 2, 5, ..., 14; ticket 17 is not looked at yet"
    assert r.draw(not_c)[0] == WAIT and r.skipped_tickets == 6, "c's last ticket ends the block: wait"


def test_repeat_an_unusable_instances_runs_are_skipped_whole() -> None:
    r = rotation("repeat(n=3)")
    r.leased(lease(3, 36, "repeat(n=3)"))  # from ticket 3: b's run, c's, a's, ...
    got = calls(r, 24, not_c)
    assert "".join(i for i, _ in got) == "bbbaaa" * 4
    runs = {t // 3: i for i, t in got}
    assert all(len({i for i, t in got if t // 3 == run}) == 1 for run in runs), "every run on one instance"
    assert sorted(t for _, t in got) == [t for t in range(3, 39) if (t // 3) % 3 != 2]


def test_weighted_the_usable_instances_keep_their_proportions() -> None:
    heavy = Member("echo-a", "127.0.0.1", 9001, weight=300)
    members = [heavy, B, C]  # schedule a a b c a over weights 3:1:1
    r = rotation("weighted", known=members)
    r.leased(lease(0, 50, "weighted", members))

    def not_b(member_id: str) -> bool:
        return member_id != B.id

    got = calls(r, 40, not_b)
    assert Counter(i for i, _ in got) == {"a": 30, "c": 10}, "3 : 1, as the weights"
    assert r.skipped_tickets == 10


def test_the_skipping_is_bounded_by_the_tickets_held() -> None:
    # The current and the next block hold only c's tickets: both are spent, and the call waits
    # for the next lease, which the rotation asks for.
    r = rotation()
    r.leased(Lease(0, 4, ABC, "round_robin", [2, 2, 2, 2]))
    r.leased(Lease(4, 4, ABC, "round_robin", [2, 2, 2, 2]))
    decision, count = r.draw(not_c)
    assert decision == WAIT and count is not None
    assert r.skipped_tickets == 8
    r.leased(Lease(8, 2, [A, B], "round_robin", [1, 0]))
    assert calls(r, 2, not_c) == [("b", 8), ("a", 9)]


def test_with_no_instance_of_the_list_usable_nothing_is_used_up() -> None:
    r = rotation()
    r.leased(lease(0, 6))
    assert r.draw(lambda _: False)[0] == NONE_USABLE
    assert r.skipped_tickets == 0
    assert calls(r, 2) == [("a", 0), ("b", 1)]


def test_a_list_that_left_out_the_usable_instances_is_passed_over() -> None:
    # The block is positioned over a and b (c was excluded when it was leased); now a and b are
    # unusable and c is usable again: the block's tickets are gaps, and the call waits for the
    # lease the rotation asks for, instead of failing while c could take it.
    r = rotation()
    r.leased(lease(0, 8, members=[A, B]))

    def only_c(member_id: str) -> bool:
        return member_id == C.id

    decision, count = r.draw(only_c)
    assert decision == WAIT and count is not None and r.skipped_tickets == 8
    r.leased(lease(8, 2, members=[C]))
    assert calls(r, 2, only_c) == [("c", 8), ("c", 9)]


def test_leases_exclude_the_unusable_ids_in_id_order_at_most_a_thousand() -> None:
    assert excluded_ids(["echo-c", "echo-a", "echo-b"], not_c) == ["echo-c"]
    assert excluded_ids(["echo-c", "echo-a"], everyone) == []
    many = [f"i{n:05d}" for n in reversed(range(1500))]
    held = excluded_ids(many, lambda i: i == "i00003")
    assert len(held) == MAX_EXCLUDE == 1000
    assert held == sorted(held) and held[0] == "i00000" and "i00003" not in held and held[-1] == "i01000"


def test_an_exclude_rota_refused_is_not_sent_again() -> None:
    # rota refuses a lease whose exclude names every eligible instance (under gray release, all
    # of one version's): the rotation asks again at once without exclude, and leaves that set
    # out of its later leases; another set is sent again.
    r = rotation()
    assert r.exclusion(["echo-c"]) == ["echo-c"]
    count = r.refused_excluding(["echo-c"])
    assert count > 0 and r.draw(everyone) == (WAIT, None), "the lease without exclude is under way"
    assert r.exclusion(["echo-c"]) == []
    assert r.exclusion(["echo-b", "echo-c"]) == ["echo-b", "echo-c"]
    assert r.exclusion([]) == []
    r.leased(lease(0, 3))
    assert not r.outage and calls(r, 2, not_c) == [("a", 0), ("b", 1)]


def test_a_changed_instance_list_drops_the_held_tickets() -> None:
    r = rotation()
    r.leased(lease(0, 16))
    assert calls(r, 1) == [("a", 0)]
    count = r.refresh()
    assert count is not None and count > 0, "a block of tickets over the new list, at once"
    assert r.skipped_tickets == 15
    assert r.draw(everyone) == (WAIT, None), "the dropped tickets are not used; the lease is under way"
    r.leased(lease(16, 4, members=[A, B]))
    assert calls(r, 4) == [("a", 16), ("b", 17), ("a", 18), ("b", 19)]


def test_tickets_leased_before_the_list_changed_are_dropped_on_arrival() -> None:
    r = rotation()
    assert r.refresh() is None, "no list yet: nothing to refresh"
    r.leased(lease(0, 2))
    _, count = r.draw(everyone)
    assert count is not None, "half spent: the next block is asked for"
    assert r.refresh() is None, "a lease is in flight; its answer is dropped"
    follow_up, _ = r.leased(lease(2, 8))
    assert follow_up is not None and follow_up > 0
    assert r.skipped_tickets == 1 + 8
    assert r.draw(everyone) == (WAIT, None)
    r.leased(lease(10, 2, members=[A, B]))
    assert calls(r, 2) == [("a", 10), ("b", 11)]


def test_rota_unreachable_rotates_the_usable_instances_of_the_last_list() -> None:
    # repeat(n=3) while leasing; the local rotation is one call each, in id order: neither runs
    # nor weights are kept while rota is away.
    heavy = Member("echo-a", "127.0.0.1", 9001, weight=900)
    r = rotation("repeat(n=3)", known=[heavy, B, C])
    r.leased(lease(0, 1, "repeat(n=3)", [heavy, B, C]))
    drawn(r)
    assert r.failed(Refused("UNAVAILABLE", "connection refused"), answered_by_rota=False)
    local = [drawn(r) for _ in range(6)]
    assert [d.member.id[-1] for d in local] == list("abcabc")
    assert all(d.local and d.rule == "repeat(n=3)" for d in local) and [d.ticket for d in local] == list(range(6))
    assert [(d.member.id[-1], d.ticket) for d in (drawn(r, not_c) for _ in range(4))] == [
        ("a", 6),
        ("b", 7),
        ("a", 8),
        ("b", 9),
    ]
    assert r.draw(lambda _: False)[0] == NONE_USABLE


def test_rota_unreachable_before_any_lease_rotates_the_known_list_of_the_version() -> None:
    for version, want in (("", "abab"), ("v2", "vvvv"), ("nobody", "abab")):
        r = rotation(version=version, known=[V, B, A])
        assert r.failed(Refused("UNAVAILABLE", "connection refused"), answered_by_rota=False)
        assert "".join(d.member.id[-1] for d in (drawn(r) for _ in range(4))) == want, version
