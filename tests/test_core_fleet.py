"""Fleet health in the core: circuit breakers with half-open probes, retry budgets, the
shared store's exchanges with a backend (in memory here; SQLite and Redis have their own
tests), and health keyed by the backend a request reaches."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.actions import Attempt
from fallgate.fsm.core.turn import Turn
from fallgate.fsm.errors import TurnFailed
from fallgate.fsm.health import records as fleet
from fallgate.fsm.health.backend import Backend, MemoryBackend, Records, StoreUnavailable, Update
from fallgate.fsm.health.shared_store import SharedHealthStore
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import Outcome, OutcomeKind
from fallgate.fsm.policy.model import Credential, Policy, Secret, Target

import fallgate

from helpers import KEY_PREFIX, chain


class Overloaded(Exception):
    status_code = 503
    headers: dict[str, str] | None = None


def overloaded(retry_after: float | None = None) -> Overloaded:
    e = Overloaded("503")
    e.headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return e


def primary_down(calls: list[str]) -> Any:
    def call(t: Target, c: Credential) -> str:
        calls.append(t.name)
        if t.index == 0:
            raise overloaded()
        return "fallback answer"

    return call


# -- records: the pure rules --------------------------------------------------------------------


def test_the_breaker_opens_only_after_more_than_allowed_failures_within_the_window():
    p = chain("m0", breaker={"allowed_failures": 2, "window": 60})
    r: dict[str, Any] = {}
    r = fleet.fail(r, 100.0, p, None, "a")
    r = fleet.fail(r, 110.0, p, None, "b")
    assert fleet.num(r, "until") == 0 and r["fails"] == 2
    r = fleet.fail(r, 120.0, p, None, "c")
    assert r["until"] == 125.0 and r["opens"] == 1  # 5 s, the cooldown's first step


def test_failures_outside_the_window_start_a_new_one():
    p = chain("m0", breaker={"allowed_failures": 1, "window": 10})
    r = fleet.fail({}, 100.0, p, None, "a")
    r = fleet.fail(r, 111.0, p, None, "b")  # 11 s later: the first one no longer counts
    assert r["fails"] == 1 and fleet.num(r, "until") == 0


def test_a_retry_after_opens_the_breaker_at_once_for_that_long():
    p = chain("m0")
    r = fleet.fail({}, 100.0, p, 20.0, "a")
    assert r["until"] == 120.0 and r["opens"] == 1


def test_an_open_span_is_never_extended_by_late_reports():
    p = chain("m0")
    r = fleet.fail({}, 100.0, p, 20.0, "a")
    assert fleet.fail(r, 105.0, p, 60.0, "b") is r
    assert fleet.fail(r, 105.0, p, None, "b") is r


def test_a_failed_probe_reopens_for_longer_and_only_the_probers_verdict_counts():
    p = chain("m0", cooldown={"initial": 5, "multiplier": 2, "cap": 300})
    r = fleet.fail({}, 100.0, p, 5.0, "a")  # open until 105
    assert fleet.is_half_open(r, 106.0)
    leased = fleet.acquire(r, 106.0, "prober", 60.0)
    assert leased is not None
    assert fleet.fail(leased, 107.0, p, None, "someone-else") is leased
    reopened = fleet.fail(leased, 107.0, p, None, "prober")
    assert reopened["opens"] == 2 and reopened["until"] == 117.0  # 10 s: grown
    assert reopened["lease"] == 0 and reopened["owner"] == ""


def test_the_probe_lease_is_exclusive_until_it_expires():
    r = fleet.acquire({"opens": 1, "until": 10.0}, 20.0, "a", 30.0)
    assert r is not None
    assert fleet.acquire(r, 25.0, "b", 30.0) is None
    assert fleet.acquire(r, 25.0, "a", 30.0) is not None  # its holder renews it
    assert fleet.acquire(r, 50.0, "b", 30.0) is not None  # expired: a crashed prober


def test_a_success_closes_the_breaker_and_refills_the_budget():
    p = chain("m0", retry_budget={"size": 3, "refill": 0.5})
    r: dict[str, Any] | None = {"opens": 2, "until": 10.0, "tokens": 1.0}
    r = fleet.succeed(r, p)
    assert r == {"tokens": 1.5}
    r = fleet.succeed(fleet.succeed(fleet.succeed(r, p), p), p)
    assert r == {}  # full again: nothing to keep


def test_an_empty_budget_refuses_a_retry():
    p = chain("m0", retry_budget={"size": 2})
    r = fleet.spend({}, p)
    assert r is not None and r["tokens"] == 1.0
    r = fleet.spend(r, p)
    assert r is not None and r["tokens"] == 0.0
    assert fleet.spend(r, p) is None


def test_the_budget_can_be_switched_off():
    p = chain("m0", retry_budget={"enabled": False})
    assert fleet.spend({"tokens": 0.0}, p) == {"tokens": 0.0}


# -- the machine: breaker and budget across turns -----------------------------------------------


def test_one_503_no_longer_moves_an_agents_later_turns_to_the_fallback():
    """The issue's agent: a 503 on the primary, then 4 turns 0.5 s apart. The turn the 503
    hit falls back; every later one goes to the primary again (before: all to the
    fallback, the primary benched for 5 s)."""
    policy = chain("glm-5.1", "glm-4.7")
    health, clock = HealthStore(), VirtualClock()
    first = play(policy, ["overloaded", "success"], health=health, clock=clock)
    assert first.models == ["glm-5.1", "glm-4.7"]
    for _ in range(4):
        clock.advance(0.5)
        later = play(policy, ["success"], health=health, clock=clock)
        assert later.models == ["glm-5.1"]


def test_a_backend_that_keeps_failing_is_benched_after_its_third_failed_turn():
    policy = chain("m0", "m1")
    health, clock = HealthStore(), VirtualClock()
    for _ in range(3):
        assert play(policy, ["overloaded", "success"], health=health, clock=clock).models == [
            "m0",
            "m1",
        ]
        clock.advance(1)
    benched = play(policy, ["success"], health=health, clock=clock)
    assert benched.models == ["m1"]
    assert benched.trace[-1].source == "fallback_1"


def test_a_half_open_target_gets_one_probe_and_another_turn_moves_on():
    """Two turns start while the primary is half-open: the first takes the probe lease,
    the second is refused by the store (`denied`) and answers from the fallback; the
    probe's success closes the breaker."""
    policy = chain("m0", "m1")
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[0].key, clock.now() + 5, clock.now())
    clock.advance(6)
    a = Turn(policy, health=health, clock=clock.now)
    b = Turn(policy, health=health, clock=clock.now)
    first_a = a.start()
    first_b = b.start()
    assert isinstance(first_a, Attempt) and isinstance(first_b, Attempt)
    assert first_a.probe and first_b.probe  # both saw it half-open
    assert health.grant(a.s, first_a) is None  # a's lease
    why = health.grant(b.s, first_b)
    assert why is not None and "probing" in why
    moved = b.deny(why)
    assert isinstance(moved, Attempt) and moved.target.name == "fallback_1"
    assert b.trace[-1].event == "denied"
    a.feed(Outcome(OutcomeKind.SUCCESS, value="probe ok"))
    assert health.record(policy.targets[0].key) == {}  # closed
    b.feed(Outcome(OutcomeKind.SUCCESS, value="fallback ok"))


def test_a_third_turn_skips_the_target_while_its_probe_is_out():
    policy = chain("m0", "m1")
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[0].key, clock.now() + 5, clock.now())
    clock.advance(6)
    a = Turn(policy, health=health, clock=clock.now)
    probe = a.start()
    assert isinstance(probe, Attempt) and health.grant(a.s, probe) is None
    c = Turn(policy, health=health, clock=clock.now)
    went = c.start()
    assert isinstance(went, Attempt) and went.target.name == "fallback_1"


def test_a_failed_probe_reopens_the_breaker_and_the_prober_does_not_retry():
    policy = chain("m0", "m1", max_attempts=3)
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[0].key, clock.now() + 5, clock.now())
    clock.advance(6)
    played = play(policy, ["overloaded", "success"], health=health, clock=clock)
    assert played.models == ["m0", "m1"]  # one probe, no retry on m0
    r = health.record(policy.targets[0].key)
    assert r["opens"] == 2 and r["until"] == pytest.approx(clock.now() + 10)


def test_a_crashed_probers_lease_expires():
    policy = chain("m0", "m1", attempt_timeout=30)
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[0].key, clock.now() + 5, clock.now())
    clock.advance(6)
    crashed = Turn(policy, health=health, clock=clock.now)
    probe = crashed.start()
    assert isinstance(probe, Attempt) and health.grant(crashed.s, probe) is None
    # the prober's process dies here: nobody feeds its outcome
    assert play(policy, ["success"], health=health, clock=clock).models == ["m1"]
    clock.advance(31)
    assert play(policy, ["success"], health=health, clock=clock).models == ["m0"]


def test_an_empty_retry_budget_stops_the_retries_and_the_breaker_takes_over():
    """A storm: the only target answers 503 to everything, its breaker's failure count
    out of play. Turns 1 and 2 spend the budget (3 requests each); turn 3's retry is
    refused by the empty bucket, which trips the breaker: it waits 5 s for the verdict
    and probes (2 requests); turns 4 and 5 wait for the 10 s and 20 s spans and probe
    (1 each). Then the breaker has been failing for 35 s, longer than retry_after_cap:
    every later turn fails at once, with neither a request nor a wait."""
    policy = chain(
        "m0", max_attempts=3, retry_budget={"size": 4}, breaker={"allowed_failures": 1000}
    )
    health, clock = HealthStore(), VirtualClock()
    calls: list[str] = []
    started = clock.now()
    for _ in range(20):
        with pytest.raises(TurnFailed) as failed:
            fallgate.run(policy, primary_down(calls), health=health, clock=clock)
        clock.advance(0.01)
    assert len(calls) == 3 + 3 + 2 + 1 + 1
    assert "every target is cooling beyond the Retry-After cap" in str(failed.value)
    # the three spans, each waited with its spread (a tenth, at least 0.5 s), the two
    # backoffs of turns 1 and 2 (0.5 s and 1 s at most), 20 x 0.01 s: no other wait
    spans = 5 + 10 + 20
    assert clock.now() - started <= spans + (0.5 + 1 + 2) + 2 * (0.5 + 1) + 0.2 + 1e-6


def test_an_empty_budget_sends_the_retry_to_the_fallback():
    policy = chain("m0", "m1", max_attempts=3, retry_budget={"size": 1}, prefer_waiting=True)
    health, clock = HealthStore(), VirtualClock()
    first = play(policy, ["overloaded", "overloaded", "success"], health=health, clock=clock)
    assert first.models == ["m0", "m0", "m1"]  # one retry: the one token
    second = play(policy, ["overloaded", "success"], health=health, clock=clock)
    assert second.models == ["m0", "m1"]  # no token left: no retry


def test_rotation_is_free_but_a_wait_for_the_same_target_spends():
    policy = chain("m0", keys=2, retry_budget={"size": 1}, max_attempts=3)
    health, clock = HealthStore(), VirtualClock()
    played = play(
        policy,
        [Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=1.0)] * 2 + ["success"],
        health=health,
        clock=clock,
    )
    assert played.credentials == ["key#1", "key#2", "key#1"]
    # the wait's retry took the one token; the success put 0.2 back
    assert health.retry_tokens(policy.targets[0].key, policy) == pytest.approx(0.2)


def test_aliases_of_one_backend_share_their_health_across_turns():
    alias = {"model": "m", "provider": "other", "base_url": "https://p0.test/v1"}
    policy = chain("m", alias, "n")
    assert policy.targets[0].key == policy.targets[1].key
    health, clock = HealthStore(), VirtualClock()
    ra = Outcome(OutcomeKind.OVERLOADED, status=503, retry_after=20.0)
    play(policy, [ra, "success"], health=health, clock=clock)
    later = play(policy, ["success"], health=health, clock=clock)
    assert later.models == ["n"]  # neither name of the benched backend


def test_a_literal_keys_health_id_is_stable_and_reveals_nothing():
    a = Credential.literal(f"{KEY_PREFIX}-secret-1", 1)
    b = Credential.literal(f"{KEY_PREFIX}-secret-1", 7)
    c = Credential.literal(f"{KEY_PREFIX}-secret-2", 1)
    assert a.health_id == b.health_id != c.health_id
    assert a.health_id.startswith("key:") and len(a.health_id) == 20
    assert "secret" not in a.health_id and KEY_PREFIX not in a.health_id
    assert Credential.from_env("X_KEY").health_id == "env:X_KEY"
    assert Credential(id="k", key=Secret("sk-abcdef")).id == "k"


def test_breaker_and_budget_fields_are_validated_by_name():
    with pytest.raises(fallgate.PolicyError) as e:
        chain(
            "m0",
            breaker={"allowed_failures": -1, "window": "soon"},
            retry_budget={"size": 0, "refill": -1, "enabled": "yes", "sise": 3},
        )
    text = str(e.value)
    for path in (
        "breaker.allowed_failures",
        "breaker.window",
        "retry_budget.size",
        "retry_budget.refill",
        "retry_budget.enabled",
        "retry_budget.sise",
    ):
        assert path in text


def test_breaker_and_budget_load_from_toml(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(
        '[primary]\nprovider = "openai"\nmodel = "m"\nkey_env = "K"\n'
        "[breaker]\nallowed_failures = 5\nwindow = 30\n"
        "[retry_budget]\nsize = 50\nrefill = 1\n"
    )
    p = Policy.from_toml(f)
    assert (p.breaker.allowed_failures, p.breaker.window) == (5, 30)
    assert (p.retry_budget.size, p.retry_budget.refill) == (50, 1)
    f.write_text(
        '[primary]\nprovider = "openai"\nmodel = "m"\nkey_env = "K"\n'
        "[breaker]\nallowed_failures = 1.5\n"
    )
    with pytest.raises(fallgate.PolicyError) as e:
        Policy.from_toml(f)
    assert "breaker.allowed_failures" in str(e.value) and "line 6" in str(e.value)


# -- the shared store -----------------------------------------------------------------------------


def shared_pair() -> tuple[MemoryBackend, VirtualClock, SharedHealthStore, SharedHealthStore]:
    """A backend on its own clock (starting far from the turns'), and two stores on it."""
    wall = VirtualClock()
    wall.advance(5000)
    backend = MemoryBackend(clock=wall.now)
    return backend, wall, SharedHealthStore(backend), SharedHealthStore(backend)


def test_a_cooldown_one_process_learns_is_honoured_by_another_whose_clock_disagrees():
    """Two stores (two processes) on one backend; their turn clocks are 777 s apart and
    the backend's is a third. A 503 Retry-After 20 seen by A benches the primary for B
    for those 20 s, in B's own clock."""
    policy = chain("m0", "m1")
    _, _, a, b = shared_pair()
    ca, cb = VirtualClock(), VirtualClock()
    cb.advance(777)
    calls: list[str] = []

    def call(t: Target, c: Credential) -> str:
        calls.append(t.name)
        if t.index == 0:
            raise overloaded(20)
        return "ok"

    assert fallgate.run(policy, call, health=a, clock=ca).target == "fallback_1"
    calls.clear()
    assert fallgate.run(policy, call, health=b, clock=cb).target == "fallback_1"
    assert calls == ["fallback_1"]
    until = b.target_until(policy.targets[0].key)
    assert until == pytest.approx(cb.now() + 20)


def test_round_trips_are_at_most_one_per_attempt_plus_the_turns_start_and_end():
    policy = chain("m0", "m1", max_attempts=3)
    backend, _, a, _ = shared_pair()
    clock = VirtualClock()
    calls: list[str] = []
    fallgate.run(policy, primary_down(calls), health=a, clock=clock)
    assert backend.round_trips <= len(calls) + 2
    fallgate.run(policy, lambda t, c: "ok", health=a, clock=clock)  # closes m0's window
    before = backend.round_trips
    fallgate.run(policy, lambda t, c: "ok", health=a, clock=clock)  # a happy turn
    assert backend.round_trips - before == 1  # it reads the chain once; nothing to write


class Flaky:
    """A backend that can be switched off (StoreUnavailable), like a stopped Redis."""

    url = "flaky://"

    def __init__(self) -> None:
        self.inner = MemoryBackend()
        self.up = True
        self.threads: set[int] = set()

    def transact(self, keys: Any, update: Update, ttl: float) -> tuple[Records, float]:
        self.threads.add(threading.get_ident())
        if not self.up:
            raise StoreUnavailable("flaky:// is down")
        return self.inner.transact(keys, update, ttl)

    def scan(self) -> tuple[Records, float]:
        return self.inner.scan()

    def delete(self, prefix: str) -> int:
        return self.inner.delete(prefix)

    def close(self) -> None:
        pass


def test_an_unreachable_store_never_fails_a_turn_warns_once_and_catches_up(caplog):
    policy = chain("m0", "m1")
    flaky = Flaky()
    assert isinstance(flaky, Backend)
    store = SharedHealthStore(flaky)
    clock = VirtualClock()
    flaky.up = False
    calls: list[str] = []
    with caplog.at_level(logging.WARNING, logger="fallgate"):
        for _ in range(3):
            call = primary_down(calls)
            assert fallgate.run(policy, call, health=store, clock=clock).value == "fallback answer"
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("fallgate: health store")
    ]
    assert len(warnings) == 1 and "flaky://" in warnings[0].getMessage()
    # local health went on: the third failed turn opened the breaker in the replica
    assert fallgate.run(policy, primary_down(calls), health=store, clock=clock).target == (
        "fallback_1"
    )
    assert store.pending() > 0
    flaky.up = True
    fallgate.run(policy, primary_down(calls), health=store, clock=clock)
    assert store.pending() == 0
    records, _ = flaky.inner.scan()
    assert any(k.startswith("t|") and r.get("opens") for k, r in records.items())


def test_the_async_driver_exchanges_off_the_event_loop():
    policy = chain("m0")
    flaky = Flaky()
    store = SharedHealthStore(flaky)

    async def main() -> int:
        async def call(t: Target, c: Credential) -> str:
            return "ok"

        await fallgate.arun(policy, call, health=store, clock=VirtualClock())
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert flaky.threads and loop_thread not in flaky.threads


def test_the_probe_lease_is_fleet_wide():
    """Two processes' stores: the first takes the probe lease on the backend; the second,
    whose replica also shows the target half-open, is refused and moves on."""
    policy = chain("m0", "m1")
    _, wall, a, b = shared_pair()
    clock = VirtualClock()
    a.open_target(policy.targets[0].key, clock.now() + 5, clock.now())
    a.end(Turn(policy, health=a, clock=clock.now).s)  # written to the backend
    clock.advance(6)
    wall.advance(6)
    ta = Turn(policy, health=a, clock=clock.now)
    tb = Turn(policy, health=b, clock=clock.now)
    a.begin(ta.s)
    b.begin(tb.s)
    pa, pb = ta.start(), tb.start()
    assert isinstance(pa, Attempt) and isinstance(pb, Attempt) and pa.probe and pb.probe
    assert a.grant(ta.s, pa) is None
    why = b.grant(tb.s, pb)
    assert why is not None and "probing" in why
    assert tb.deny(why).target.name == "fallback_1"  # type: ignore[union-attr]


def test_a_shared_store_takes_only_a_backend():
    with pytest.raises(TypeError, match=r"fsm\.health\.backend\.Backend"):
        SharedHealthStore(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        SharedHealthStore(MemoryBackend(), ttl=0)


class Garbled(Flaky):
    """A backend whose records were written by something else (wrong types, junk)."""

    def transact(self, keys: Any, update: Update, ttl: float) -> tuple[Records, float]:
        records, now = super().transact(keys, update, ttl)
        junk = {"until": "soon", "opens": None, "tokens": float("nan"), "owner": 7, "x": [1]}
        return {k: (dict(junk) if k.startswith("t|") else r) for k, r in records.items()}, now


def test_records_of_the_wrong_shape_from_a_backend_are_dropped_field_by_field():
    policy = chain("m0", "m1")
    store = SharedHealthStore(Garbled())
    result = fallgate.run(policy, lambda t, c: "ok", health=store, clock=VirtualClock())
    assert result.target == "primary"
    assert store.record(policy.targets[0].key) == {}


@pytest.mark.parametrize(
    ("deadline", "cap", "says"),
    [(1, 30, "past what the 1 s deadline leaves"), (60, 2, "beyond the Retry-After cap")],
    ids=["the-deadline-binds", "the-cap-binds"],
)
def test_a_turn_that_cannot_wait_for_an_open_breaker_names_the_limit_that_binds(
    deadline, cap, says
):
    """The only target's breaker opens for 5 s. A turn that may not wait for it fails at
    once, and says why: with a 1 s deadline and a 30 s cap the wait fits the cap but
    not the deadline; with a 2 s cap the cap is what it is beyond."""
    policy = chain("m0", max_attempts=1, deadline=deadline, retry_after_cap=cap)
    health, clock = HealthStore(), VirtualClock()
    calls: list[str] = []
    for _ in range(3):  # the breaker's allowed failures, then it opens
        with pytest.raises(TurnFailed):
            fallgate.run(policy, primary_down(calls), health=health, clock=clock)
    with pytest.raises(TurnFailed) as failed:
        fallgate.run(policy, primary_down(calls), health=health, clock=clock)
    assert len(calls) == 3, "the fourth turn sends nothing"
    assert f"every target is cooling {says} (the first is free in 5 s)" in str(failed.value)
