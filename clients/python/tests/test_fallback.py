"""The local fallback: round robin over the watched list, version isolation, transport failures only."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from rota import (
    AsyncRotaClient,
    Instance,
    InstanceCache,
    InstanceRef,
    InstanceStatus,
    RotaClient,
    RotaError,
    WatchEvent,
)
from rota.errors import is_unreachable
from rota.fallback import OutageState

SERVICE = "svc"


def inst(id: str, version: str = "", status: InstanceStatus = InstanceStatus.UP, port: int = 9000) -> Instance:
    return Instance(SERVICE, "127.0.0.1", port, id=id, version=version, status=status)


def cache_with(*instances: Instance, epoch: int = 7) -> InstanceCache:
    cache = InstanceCache(SERVICE)
    cache.apply(WatchEvent("snapshot", epoch, instances=instances))
    return cache


def picks(cache: InstanceCache, n: int, version: str = "", exclude: tuple[str, ...] = ()) -> list[str]:
    out = []
    for _ in range(n):
        picked = cache.pick(version, exclude)
        assert picked is not None
        out.append(picked.instance.id)
    return out


# -- the cache ---------------------------------------------------------------------------------


def test_round_robin_over_up_unversioned_instances_sorted_by_id() -> None:
    cache = cache_with(
        inst("c"),
        inst("a"),
        inst("b"),
        inst("d", status=InstanceStatus.DRAINING),
        inst("e", status=InstanceStatus.DOWN),
    )
    results = [cache.pick() for _ in range(4)]
    assert [r.instance.id for r in results if r] == ["a", "b", "c", "a"]
    first = results[0]
    assert first is not None
    assert (first.ticket, first.rule, first.fallback, first.epoch, first.local_fallback) == (
        0,
        "round_robin",
        "",
        7,
        True,
    )
    assert [r.ticket for r in results if r] == [0, 1, 2, 3]


def test_version_isolation_matches_rota() -> None:
    cache = cache_with(
        inst("plain-1"),
        inst("plain-2"),
        inst("zlt-1", "zlt"),
        inst("bob-1", "bob"),
        inst("gone-1", "gone", InstanceStatus.DRAINING),
    )
    assert picks(cache, 4) == ["plain-1", "plain-2", "plain-1", "plain-2"]
    assert picks(cache, 3, version="zlt") == ["zlt-1"] * 3
    zlt = cache.pick("zlt")
    assert zlt is not None and zlt.fallback == ""
    nobody = cache.pick("nobody")
    assert nobody is not None
    assert nobody.fallback == 'no instance with version "nobody"; picked from instances with no version'
    # A version whose only instance drains counts as absent.
    gone = cache.pick("gone")
    assert gone is not None and gone.instance.id in {"plain-1", "plain-2"} and gone.fallback != ""


def test_each_subset_has_its_own_rotation() -> None:
    cache = cache_with(inst("a"), inst("b"), inst("v1", "x"), inst("v2", "x"))
    assert picks(cache, 1) == ["a"]
    assert picks(cache, 3, version="x") == ["v1", "v2", "v1"]
    assert picks(cache, 2) == ["b", "a"]
    # A missing version falls back to the unversioned rotation and continues it.
    assert picks(cache, 1, version="missing") == ["b"]


def test_exclude_is_applied_after_version_isolation() -> None:
    cache = cache_with(inst("a"), inst("b"), inst("v1", "x"))
    assert picks(cache, 3, exclude=("a",)) == ["b", "b", "b"]
    # As on rota: version x exists, so excluding its only instance leaves nothing (no fallback).
    assert cache.pick("x", exclude=("v1",)) is None


def test_exclude_rotates_over_the_instances_left() -> None:
    # As rota's round robin: ticket t takes position t mod k among the k instances that are not
    # excluded. (Skipping forward from position t mod n would give a, c, c.)
    cache = cache_with(inst("a"), inst("b"), inst("c"))
    results = [cache.pick(exclude=("b",)) for _ in range(3)]
    assert [(r.instance.id, r.ticket) for r in results if r] == [("a", 0), ("c", 1), ("a", 2)]


def test_an_empty_snapshot_of_a_rota_that_has_not_seen_the_service_keeps_the_list() -> None:
    cache = cache_with(inst("a"), inst("b"), epoch=4)
    cache.apply(WatchEvent("snapshot", 0, instances=()))
    assert [i.id for i in cache.instances()] == ["a", "b"]
    # An empty list at a real epoch is rota's word: the instances are gone.
    cache.apply(WatchEvent("snapshot", 5, instances=()))
    assert cache.instances() == []


def test_nothing_eligible_gives_none() -> None:
    assert InstanceCache(SERVICE).pick() is None
    assert cache_with(inst("v1", "x")).pick() is None
    assert cache_with(inst("a", status=InstanceStatus.DOWN)).pick() is None


def test_watch_events_keep_the_cache_in_step() -> None:
    cache = InstanceCache(SERVICE)
    assert not cache.synced
    cache.apply(WatchEvent("snapshot", 1, instances=(inst("a"), inst("b"))))
    assert cache.synced
    cache.apply(WatchEvent("added", 2, instance=inst("c")))
    cache.apply(WatchEvent("updated", 3, instance=inst("a", status=InstanceStatus.DRAINING)))
    cache.apply(WatchEvent("removed", 4, ref=InstanceRef(SERVICE, "b")))
    assert [(i.id, i.status) for i in cache.instances()] == [("a", InstanceStatus.DRAINING), ("c", InstanceStatus.UP)]
    assert cache.epoch == 4
    assert picks(cache, 2) == ["c", "c"]
    cache.apply(WatchEvent("snapshot", 9, instances=(inst("z"),)))
    assert [i.id for i in cache.instances()] == ["z"]
    assert cache.epoch == 9


def test_wait_for_wakes_on_an_update_from_another_thread() -> None:
    cache = InstanceCache(SERVICE)
    ready = threading.Event()

    def feed() -> None:
        ready.wait(5)
        cache.apply(WatchEvent("snapshot", 1, instances=(inst("a"),)))

    feeder = threading.Thread(target=feed)
    feeder.start()
    ready.set()
    assert cache.wait_for(lambda c: [i.id for i in c.instances()] == ["a"], timeout=5)
    feeder.join(5)
    assert not cache.wait_for(lambda c: len(c.instances()) == 2, timeout=0.05)


async def test_wait_for_async_wakes_on_an_update() -> None:
    import asyncio

    cache = InstanceCache(SERVICE)
    asyncio.get_running_loop().call_soon(cache.apply, WatchEvent("snapshot", 1, instances=(inst("a"),)))
    assert await cache.wait_for_async(lambda c: c.synced, timeout=5)
    assert not await cache.wait_for_async(lambda c: c.epoch == 2, timeout=0.05)


# -- when the fallback is used -----------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[()]:
        return ()

    # grpc-stubs declares RpcError.trailing_metadata as _Metadatum objects, but the errors grpc
    # raises (grpc.Call) return (key, value) pairs, which rota.errors reads; the fake does too.
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._trailing


REFUSED = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
DEADLINE = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
NOTHING_ELIGIBLE = FakeRpcError(
    grpc.StatusCode.UNAVAILABLE,
    'service "svc" has no UP instance without a version',
    trailing=(("rota-error", "no_eligible_instance"), ("date", "Mon, 30 Nov 2026 04:37:30 GMT")),
)
NOT_FOUND = FakeRpcError(
    grpc.StatusCode.NOT_FOUND, 'service "svc" has never been registered', (("rota-error", "unknown_service"),)
)
# A proxy in front of a rota that is down answers with headers of its own but without rota's trailer.
PROXY_UNAVAILABLE = FakeRpcError(
    grpc.StatusCode.UNAVAILABLE, "no healthy upstream", (("date", "x"), ("server", "proxy"))
)


@pytest.mark.parametrize(
    ("error", "unreachable", "reason"),
    [
        (REFUSED, True, ""),
        (DEADLINE, True, ""),
        (PROXY_UNAVAILABLE, True, ""),
        (NOTHING_ELIGIBLE, False, "no_eligible_instance"),
        (NOT_FOUND, False, "unknown_service"),
        (FakeRpcError(grpc.StatusCode.INTERNAL, "boom"), False, ""),
    ],
    ids=["refused", "deadline", "proxy", "server-unavailable", "not-found", "internal"],
)
def test_unreachable_means_no_answer_from_rota(error: FakeRpcError, unreachable: bool, reason: str) -> None:
    assert is_unreachable(error) is unreachable
    converted = RotaError.from_rpc_error(error)
    assert (converted.code, converted.message, converted.reason, converted.unreachable) == (
        error.code(),
        error.details(),
        reason,
        unreachable,
    )


class FakeBalancer:
    def __init__(self, error: grpc.RpcError) -> None:
        self.error = error
        self.requests: list[Any] = []

    def Pick(self, request: Any, timeout: float | None = None) -> Any:
        self.requests.append(request)
        raise self.error


class FakeAsyncBalancer(FakeBalancer):
    async def Pick(self, request: Any, timeout: float | None = None) -> Any:
        return super().Pick(request, timeout)


# Port 1 on loopback refuses connections: the background watcher never overwrites the cache.
NOWHERE = "127.0.0.1:1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


WARMING_UP = FakeRpcError(
    grpc.StatusCode.UNAVAILABLE,
    'rota started less than 14000 ms ago and has not seen service "svc" yet',
    (("rota-error", "warming_up"),),
)


def test_client_falls_back_only_when_rota_is_unreachable() -> None:
    with RotaClient(NOWHERE) as client:
        clock = FakeClock()
        client._outage = OutageState(clock)
        cache = client.follow(SERVICE)
        cache.apply(WatchEvent("snapshot", 3, instances=(inst("a"), inst("b"), inst("v", "zlt"))))
        client._balancer = FakeBalancer(REFUSED)  # type: ignore[assignment]
        results = [client.pick(SERVICE) for _ in range(2)]
        assert [(r.instance.id, r.local_fallback, r.epoch) for r in results] == [("a", True, 3), ("b", True, 3)]
        assert client.pick(SERVICE, version="zlt").instance.id == "v"

        clock.now += 1.0  # past the short-cut, so rota is asked again
        client._balancer = FakeBalancer(DEADLINE)  # type: ignore[assignment]
        assert client.pick(SERVICE).instance.id == "a"
        clock.now += 1.0
        client._balancer = FakeBalancer(WARMING_UP)  # type: ignore[assignment]
        warming = client.pick(SERVICE)
        assert (warming.instance.id, warming.ticket, warming.local_fallback) == ("b", 3, True)

        clock.now += 1.0
        client._balancer = FakeBalancer(NOTHING_ELIGIBLE)  # type: ignore[assignment]
        with pytest.raises(RotaError) as raised:
            client.pick(SERVICE)
        assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, False)

        client._balancer = FakeBalancer(REFUSED)  # type: ignore[assignment]
        with pytest.raises(RotaError) as raised:
            client.pick("not-followed")
        assert (raised.value.code, raised.value.unreachable) == (grpc.StatusCode.UNAVAILABLE, True)
        # Nothing eligible locally is rota's answer, not "unreachable".
        with pytest.raises(RotaError) as raised:
            client.pick(SERVICE, version="zlt", exclude=["v"])
        assert (raised.value.code, raised.value.reason, raised.value.unreachable) == (
            grpc.StatusCode.UNAVAILABLE,
            "no_eligible_instance",
            False,
        )


def test_after_three_unreachable_picks_rota_is_skipped_for_a_second() -> None:
    with RotaClient(NOWHERE) as client:
        clock = FakeClock()
        client._outage = OutageState(clock)
        client.follow(SERVICE).apply(WatchEvent("snapshot", 3, instances=(inst("a"), inst("b"))))
        balancer = FakeBalancer(REFUSED)
        client._balancer = balancer  # type: ignore[assignment]
        tickets = [client.pick(SERVICE).ticket for _ in range(5)]
        assert tickets == [0, 1, 2, 3, 4]
        assert len(balancer.requests) == 3, "picks 4 and 5 did not ask rota"
        clock.now += 0.999
        client.pick(SERVICE)
        assert len(balancer.requests) == 3
        clock.now += 0.001
        client.pick(SERVICE)
        assert len(balancer.requests) == 4, "after a second rota is asked again"
        # A service that cannot be answered locally still asks rota.
        with pytest.raises(RotaError):
            client.pick("not-followed")
        assert len(balancer.requests) == 5


def test_no_fallback_before_the_first_snapshot() -> None:
    with RotaClient(NOWHERE) as client:
        client.follow(SERVICE)
        client._balancer = FakeBalancer(REFUSED)  # type: ignore[assignment]
        with pytest.raises(RotaError, match="UNAVAILABLE"):
            client.pick(SERVICE)


async def test_async_client_falls_back_only_when_rota_is_unreachable() -> None:
    async with AsyncRotaClient(NOWHERE) as client:
        clock = FakeClock()
        client._outage = OutageState(clock)
        cache = client.follow(SERVICE)
        cache.apply(WatchEvent("snapshot", 3, instances=(inst("a"), inst("b"))))
        client._balancer = FakeAsyncBalancer(REFUSED)  # type: ignore[assignment]
        assert [(await client.pick(SERVICE)).instance.id for _ in range(3)] == ["a", "b", "a"]
        clock.now += 1.0
        client._balancer = FakeAsyncBalancer(WARMING_UP)  # type: ignore[assignment]
        assert (await client.pick(SERVICE)).local_fallback
        clock.now += 1.0
        client._balancer = FakeAsyncBalancer(NOTHING_ELIGIBLE)  # type: ignore[assignment]
        with pytest.raises(RotaError) as raised:
            await client.pick(SERVICE)
        assert raised.value.unreachable is False


class AnsweringBalancer:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Pick(self, request: Any, timeout: float | None = None) -> Any:
        from rota._convert import pb

        self.requests.append(request)
        instance = pb.Instance(id="a", service=SERVICE, host="127.0.0.1", port=9000)
        return pb.PickResponse(instance=instance, ticket=7, rule="round_robin")


def test_fallback_is_logged_once_per_outage_and_once_on_recovery(caplog: pytest.LogCaptureFixture) -> None:
    with RotaClient(NOWHERE) as client:
        clock = FakeClock()
        client._outage = OutageState(clock)
        client.follow(SERVICE).apply(WatchEvent("snapshot", 5, instances=(inst("a"),)))
        with caplog.at_level("WARNING", logger="rota"):
            client._balancer = FakeBalancer(REFUSED)  # type: ignore[assignment]
            for _ in range(5):
                client.pick(SERVICE)
            clock.now += 1.0  # past the short-cut
            client._balancer = AnsweringBalancer()  # type: ignore[assignment]
            assert not client.pick(SERVICE).local_fallback
            assert not client.pick(SERVICE).local_fallback
            client._balancer = FakeBalancer(REFUSED)  # type: ignore[assignment]
            assert client.pick(SERVICE).local_fallback
    messages = [r.getMessage() for r in caplog.records if r.name == "rota" and r.levelname == "WARNING"]
    assert messages == [
        "rota unreachable (UNAVAILABLE: failed to connect to all addresses; Connection refused); "
        "picking svc and other followed services locally from the last lists seen",
        "rota answers again; picks are rota's again",
        "rota unreachable (UNAVAILABLE: failed to connect to all addresses; Connection refused); "
        "picking svc and other followed services locally from the last lists seen",
    ]


# -- reconnecting the watch --------------------------------------------------------------------


class RecordingBackoff:
    """Stops the watcher after ``rounds`` reconnections; records resets."""

    def __init__(self, watcher: Any, rounds: int) -> None:
        self.watcher, self.rounds, self.resets, self.delays = watcher, rounds, 0, 0

    def next_delay(self) -> float:
        self.delays += 1
        if self.delays >= self.rounds:
            self.watcher._stopping.set()
        return 0.0

    def reset(self) -> None:
        self.resets += 1


class SnapshotThenClose:
    """A Watch stub whose every stream sends a snapshot and ends at once, as a draining rota
    did; ``lived`` is how long each stream appears to last on the watcher's clock."""

    def __init__(self, clock: FakeClock, lived: float) -> None:
        self.clock, self.lived = clock, lived

    def Watch(self, request: Any) -> Any:
        from rota._convert import pb

        clock, lived = self.clock, self.lived

        class Call:
            def __iter__(self) -> Any:
                yield pb.WatchEvent(snapshot=pb.InstanceList(instances=[]), epoch=1)
                clock.now += lived
                raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "rota is shutting down")

            def cancel(self) -> None:
                pass

        return Call()


@pytest.mark.parametrize(("lived", "resets"), [(0.5, 0), (5.0, 5)], ids=["short-lived", "stable"])
def test_the_watch_backoff_resets_only_after_a_stream_lived_five_seconds(lived: float, resets: int) -> None:
    import rota.client as client_module
    from rota._following import Following

    clock = FakeClock()
    watcher = client_module._Watcher(SnapshotThenClose(clock, lived), SERVICE, OutageState(clock))  # type: ignore[arg-type]
    backoff = RecordingBackoff(watcher, rounds=5)
    # The watcher's decisions on the test's clock, with a backoff that stops it after 5 rounds.
    watcher.following = Following(watcher.cache, OutageState(clock), clock=clock, backoff=backoff)  # type: ignore[arg-type]
    watcher.run()  # in this thread: returns once the backoff has stopped it
    assert backoff.delays == 5
    assert backoff.resets == resets
