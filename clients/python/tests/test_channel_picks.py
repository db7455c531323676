"""The channels' rotation fed leases rota mapped itself (``LeaseResponse.picks``, gray release
without a version), without a server: the block logic the sync and asyncio channels share."""

from __future__ import annotations

from collections.abc import Callable

from rota._pb import rota_pb2 as pb
from rota._router import lease_of
from rota._tickets import NONE_USABLE, WAIT, Draw, Lease, Member, Refused, Rotation

A = Member("echo-a", "127.0.0.1", 9001)
B = Member("echo-b", "127.0.0.1", 9002)
V = Member("echo-v", "127.0.0.1", 9003, version="v2")


def instance(m: Member) -> pb.Instance:
    return pb.Instance(service="echo", id=m.id, host=m.host, port=m.port, version=m.version)


def picks_response(picks: list[tuple[int, int]], members: list[Member] = [A, B, V]) -> pb.LeaseResponse:  # noqa: B006
    return pb.LeaseResponse(
        first_ticket=0,
        count=len(picks),
        instances=[instance(m) for m in members],
        rule="round_robin",
        picks=[pb.LeasedPick(ticket=t, position=p) for t, p in picks],
    )


def everyone(_: str) -> bool:
    return True


def rotation() -> Rotation:
    return Rotation("round_robin", "", lambda: [A, B, V])


def started(r: Rotation) -> int:
    """The first draw of a fresh rotation: it waits, and asks for the first lease."""
    decision, lease = r.draw(everyone)
    assert decision == WAIT and lease is not None
    return lease


def drawn(r: Rotation, usable: Callable[[str], bool] = everyone) -> Draw:
    decision, _ = r.draw(usable)
    assert isinstance(decision, Draw), decision
    return decision


def pick(r: Rotation, usable: Callable[[str], bool] = everyone) -> tuple[str, int]:
    """The next call's instance and ticket."""
    d = drawn(r, usable)
    return d.member.id, d.ticket


# A gray split of 2 (unversioned) to 1 (v2): tickets per version's own rotation.
GRAY = [(0, 0), (0, 2), (1, 1), (2, 0), (1, 2), (3, 1)]


def test_lease_of_reads_both_answer_shapes() -> None:
    ranged = lease_of(
        pb.LeaseResponse(first_ticket=40, count=3, instances=[instance(A), instance(B)], rule="x", positions=[1, 0, 1])
    )
    assert ranged == Lease(40, 3, [A, B], "x", [1, 0, 1])
    gray = lease_of(picks_response([(7, 2), (5, 0), (9, 3)]))
    # position 3 names no instance: left out, never routed
    assert gray.picks == [(7, V), (5, A)]
    assert (gray.first_ticket, gray.count, gray.members) == (0, 0, [A, B, V])


def test_picks_are_used_in_order_with_their_tickets() -> None:
    r = rotation()
    started(r)
    assert r.leased(lease_of(picks_response(GRAY))) == (None, False)
    draws = [drawn(r) for _ in GRAY]
    assert [(d.member.id, d.ticket) for d in draws] == [
        ("echo-a", 0),
        ("echo-v", 0),
        ("echo-b", 1),
        ("echo-a", 2),
        ("echo-v", 1),
        ("echo-b", 3),
    ]
    assert all(d.rule == "round_robin" and not d.local for d in draws)
    assert r.draw(everyone)[0] == WAIT, "a spent block is not used again"


def test_an_unusable_pick_is_a_gap_and_the_next_pick_is_taken() -> None:
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY)))

    def no_v(i: str) -> bool:
        return i != "echo-v"

    assert pick(r, no_v) == ("echo-a", 0)
    # echo-v's ticket 0 is passed over, never reused: the call takes echo-b's ticket 1
    assert [(d.member.id, d.ticket) for d in (drawn(r, no_v), drawn(r, no_v), drawn(r, no_v))] == [
        ("echo-b", 1),
        ("echo-a", 2),
        ("echo-b", 3),
    ]
    assert r.skipped_picks == 2


def test_no_usable_instance_uses_up_no_pick() -> None:
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY)))
    assert r.draw(lambda _: False)[0] == NONE_USABLE
    assert pick(r) == ("echo-a", 0)


def test_the_next_block_is_leased_at_half_and_used_after_this_one() -> None:
    r = rotation()
    size = started(r)
    block = [(t, t % 3) for t in range(size)]
    r.leased(lease_of(picks_response(block)))
    leases = []
    for _ in range(size // 2):
        _, lease = r.draw(everyone)
        leases.append(lease)
    assert leases[:-1] == [None] * (size // 2 - 1) and leases[-1] is not None, "one lease, when half is left"
    r.leased(lease_of(picks_response([(100, 1), (101, 1)])))
    rest = [drawn(r).ticket for _ in range(size - size // 2 + 2)]
    assert rest == [*range(size // 2, size), 100, 101]


def test_a_changed_instance_list_drops_held_picks_and_leases_new_ones() -> None:
    r = rotation()
    size = started(r)
    r.leased(lease_of(picks_response([(t, t % 3) for t in range(size)])))
    assert drawn(r).ticket == 0
    lease = r.refresh()
    assert lease is not None and lease > 0, "a block of picks, not a lease of no tickets"
    assert r.skipped_picks == size - 1
    assert r.draw(everyone) == (WAIT, None), "the dropped picks are not used; the lease is under way"
    r.leased(lease_of(picks_response([(4, 0), (2, 1)], [A, B])))
    assert [(d.member, d.ticket) for d in (drawn(r), drawn(r))] == [(A, 4), (B, 2)]


def test_picks_leased_before_the_list_changed_are_dropped_on_arrival() -> None:
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY[:2])))
    _, lease = r.draw(everyone)
    assert lease is not None, "half spent: the next block is asked for"
    assert r.refresh() is None, "a lease is in flight; its answer is refreshed"
    # The block in flight was chosen over the old list: dropped, and another one asked for.
    follow_up, _ = r.leased(lease_of(picks_response([(9, 2), (9, 0)])))
    assert follow_up is not None and follow_up > 0
    assert r.draw(everyone) == (WAIT, None)
    r.leased(lease_of(picks_response([(3, 1)], [A, B])))
    assert pick(r) == ("echo-b", 3)


def test_ticket_ranges_and_picks_follow_each_other() -> None:
    # The service leaves gray release: the next lease is a ticket range over one version's list.
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY[:1])))
    assert drawn(r).member == A  # and the next lease is asked for
    ranged = pb.LeaseResponse(
        first_ticket=10, count=4, instances=[instance(A), instance(B)], rule="round_robin", positions=[0, 1, 0, 1]
    )
    r.leased(lease_of(ranged))
    assert [(d.member.id, d.ticket) for d in (drawn(r) for _ in range(4))] == [
        ("echo-a", 10),
        ("echo-b", 11),
        ("echo-a", 12),
        ("echo-b", 13),
    ]
    # Held tickets are dropped on a list change too (rota positioned them over the old list).
    r.leased(
        lease_of(
            pb.LeaseResponse(first_ticket=14, count=2, instances=[instance(A)], rule="round_robin", positions=[0, 0])
        )
    )
    lease = r.refresh()
    assert lease is not None and lease > 0 and r.skipped_tickets == 2


def test_rota_unreachable_replays_the_last_picks() -> None:
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY[:3])))  # echo-a, echo-v, echo-b
    _, lease = r.draw(everyone)
    assert lease is not None
    assert r.failed(Refused("UNAVAILABLE", "connection refused"), answered_by_rota=False)
    local = [drawn(r) for _ in range(6)]
    assert [d.member.id for d in local] == ["echo-a", "echo-v", "echo-b"] * 2, "rota's last split, over again"
    assert all(d.local for d in local) and [d.ticket for d in local] == list(range(6))

    def no_v(i: str) -> bool:
        return i != "echo-v"

    assert [drawn(r, no_v).member.id for _ in range(4)] == ["echo-a", "echo-b", "echo-a", "echo-b"]
    assert r.draw(lambda _: False)[0] == NONE_USABLE


def test_rota_unreachable_after_tickets_maps_a_local_counter() -> None:
    # The service left gray release: the last answer was a ticket range, so the local rotation
    # is round robin over that list again, not the picks before it.
    r = rotation()
    started(r)
    r.leased(lease_of(picks_response(GRAY[:1])))
    drawn(r)
    r.leased(
        lease_of(
            pb.LeaseResponse(first_ticket=10, count=1, instances=[instance(A), instance(B)], rule="", positions=[1])
        )
    )
    drawn(r)
    assert r.failed(Refused("UNAVAILABLE", "connection refused"), answered_by_rota=False)
    assert [drawn(r).member.id for _ in range(3)] == ["echo-a", "echo-b", "echo-a"]
