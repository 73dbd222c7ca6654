"""Credential pools end to end: rotation, attribution, keys read at use time.

Rotation itself lives in the core; these tests prove, with the real SDK over
real HTTP, that the key each request carried (as the fault server saw it) is
the one the policy says, and that failures are charged to the credential and
target that failed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
K1, K2 = "sk-test-primary-one-111111", "sk-test-primary-two-222222"


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def keys_seen(srv: FaultServer, model: str) -> list[str | None]:
    return [r.api_key for r in srv.requests if r.model == model]


@pytest.mark.parametrize("status", [401, 429])
def test_two_keys_on_the_primary_rotate(fault_server: FaultServer, status: int) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": status}]}})
    policy = chain({"model": "a", "api_keys": [K1, K2]}, server=fault_server)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert keys_seen(fault_server, "a") == [K1, K2]
    assert [e.credential for e in result.trace if e.action == "Attempt"] == ["key#1", "key#2"]


def test_persistent_401_on_both_keys_rotates_once_then_falls_back(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 401}] * 5}})
    policy = chain({"model": "a", "api_keys": [K1, K2]}, "b", server=fault_server)
    with Fallgate(policy) as gate:
        assert gate.run(messages=MSG).model == "b"
    assert keys_seen(fault_server, "a") == [K1, K2]


def test_a_429_on_a_fallback_never_benches_the_primarys_keys(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both targets use the same env var (one account): the credential ids are equal,
    # the cooldown is still charged to (fallback, credential) only.
    monkeypatch.setenv("FG_SHARED_KEY", "sk-test-shared-444444")
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "drop"}] * 3,
                "b": [{"kind": "status", "status": 429, "headers": {"retry-after": "600"}}],
            }
        }
    )
    policy = chain(
        {"model": "a", "key_env": "FG_SHARED_KEY"},
        {"model": "b", "key_env": "FG_SHARED_KEY"},
        server=fault_server,
        max_attempts=2,
    )
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert "rate_limited" in info.value.reasons["fallback_1"]
        benched = gate.health.snapshot()["credentials"]
        assert isinstance(benched, dict)
        assert list(benched) == [(policy.targets[1].key, "env:FG_SHARED_KEY")]
        # next turn: the primary is called at once, with the same key
        result = gate.run(messages=MSG)
    assert (result.model, result.attempts) == ("a", 1)
    assert fault_server.counts == {"a": 4, "b": 1}


def test_round_robin_spreads_turns_over_the_pool(fault_server: FaultServer) -> None:
    policy = chain(
        {"model": "a", "api_keys": [K1, K2], "rotation": "round_robin"}, server=fault_server
    )
    with Fallgate(policy) as gate:
        for _ in range(4):
            gate.run(messages=MSG)
        assert gate.clients.built == 2
    assert keys_seen(fault_server, "a") == [K1, K2, K1, K2]


def test_a_missing_env_var_names_the_variable_and_falls_back(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FG_UNSET_KEY", raising=False)
    policy = chain({"model": "a", "key_env": "FG_UNSET_KEY"}, "b", server=fault_server)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
        assert result.model == "b"
        e = result.trace[1]
        assert (e.event, e.source, e.dest) == ("auth", "primary", "fallback_1")
        assert result.trace[0].credential == "env:FG_UNSET_KEY"
    assert fault_server.counts == {"b": 1}


def test_a_missing_env_var_with_no_fallback_fails_naming_it(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FG_UNSET_KEY", raising=False)
    policy = chain({"model": "a", "key_env": "FG_UNSET_KEY"}, server=fault_server)
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert "environment variable 'FG_UNSET_KEY'" in str(info.value)
        assert "primary" in info.value.reasons
        # setting it takes effect on the very next turn: no cross-turn bench
        monkeypatch.setenv("FG_UNSET_KEY", "sk-test-now-set-666666")
        assert gate.run(messages=MSG).model == "a"
    assert keys_seen(fault_server, "a") == ["sk-test-now-set-666666"]


def test_keys_are_read_at_use_time(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FG_ROTATING_KEY", "sk-test-old-777777")
    policy = chain({"model": "a", "key_env": "FG_ROTATING_KEY"}, server=fault_server)
    with Fallgate(policy) as gate:
        gate.run(messages=MSG)
        monkeypatch.setenv("FG_ROTATING_KEY", "sk-test-new-888888")
        gate.run(messages=MSG)
        assert gate.clients.built == 2
        assert gate.clients.open_clients == 1  # the old client was closed
    assert keys_seen(fault_server, "a") == ["sk-test-old-777777", "sk-test-new-888888"]


def test_no_key_ever_reaches_an_error_or_trace(fault_server: FaultServer) -> None:
    echo = {
        "kind": "status",
        "status": 401,
        "body": {"error": {"message": f"Incorrect API key provided: {K1}", "type": "auth"}},
    }
    fault_server.script({"default": echo})
    policy = chain({"model": "a", "api_keys": [K1, K2]}, server=fault_server)
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
    text = (
        str(info.value) + repr(info.value.reasons) + "".join(e.to_json() for e in info.value.trace)
    )
    assert K1 not in text and K2 not in text
    assert K1[8:20] not in text
    assert "***" in text


# -- transport recovery per client generation ---------------------------------------------------


def test_turns_that_saw_the_same_client_share_one_rebuild():
    """Two turns lease generation 0; the first one's recovery rebuilds, the second's finds
    the client already rebuilt since and reuses it. A turn that saw the new generation
    fail (or a caller naming no generation) rebuilds again; one whose client answered
    another turn meanwhile does not."""
    from fallgate.providers.openai.http.pools import ClientPool, Seen, openai_factory

    policy = chain("a", server=None)
    target, cred = policy.targets[0], policy.targets[0].pool()[0]
    pool = ClientPool(openai_factory(5.0))
    first, second = Seen(), Seen()
    with pytest.raises(OSError):
        with pool.lease(target, cred, first) as c0, pool.lease(target, cred, second) as c0b:
            assert c0 is c0b and first.generation == second.generation == {"primary": 0}
            raise OSError("timed out")  # both attempts failed
    pool.rebuild(target, first)
    pool.rebuild(target, second)  # already rebuilt since generation 0: nothing to do
    assert (pool.built, pool.rebuilds, pool.generation(target)) == (2, 1, 1)
    assert second.generation == {"primary": 1}
    with pytest.raises(OSError), pool.lease(target, cred, second) as c1:
        assert c1 is not c0
        raise OSError("timed out")  # the attempt on generation 1 failed
    pool.rebuild(target, second)  # this turn saw generation 1 broken: a new one
    pool.rebuild(target)  # no view: always rebuilds
    assert (pool.built, pool.rebuilds) == (4, 3)
    # A client that answered another turn after this turn's attempt began is not
    # broken (an overloaded server or loop): it is kept, with its warm connections.
    third = Seen()
    with pytest.raises(OSError), pool.lease(target, cred, third):
        with pool.lease(target, cred):
            pass  # another turn's request on the same client succeeds meanwhile
        raise OSError("timed out")
    pool.rebuild(target, third)
    assert (pool.built, pool.rebuilds) == (4, 3)
    pool.close()


def test_a_hundred_concurrent_recoveries_rebuild_the_shared_client_once(
    fault_server: FaultServer,
) -> None:
    """100 turns whose first attempts all drop recover at about the same moment: one
    rebuild of the primary's client serves them all (before: one per turn, 100)."""
    import asyncio

    from fallgate.providers import AsyncFallgate

    turns = 100
    fault_server.script(
        {"models": {"a": [{"kind": "drop"}] * (2 * turns), "b": [{"kind": "answer"}] * turns}}
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1)

    async def main() -> tuple[int, int, list[str]]:
        async with AsyncFallgate(policy) as gate:
            results = await asyncio.gather(*(gate.arun(messages=MSG) for _ in range(turns)))
            return gate.clients.built, gate.clients.rebuilds, [r.model for r in results]

    built, rebuilds, models = asyncio.run(main())
    assert models == ["b"] * turns
    assert rebuilds == 1, rebuilds
    assert built == 3  # a, a rebuilt once, b


def test_a_timeout_while_the_target_answered_another_turn_is_a_connection_fault(
    fault_server: FaultServer,
) -> None:
    """Turn A's first request hangs to its 1 s timeout while turn B is answered: A's
    fault is marked `client_side` (the pool saw the target answer B since A's
    lease), so A backs off and retries without a recovery, a retry token or a breaker
    report, even with the target's retry budget empty (on the engine before this rule:
    "no retry: the retry budget of primary is empty")."""
    import asyncio

    from fallgate.fsm import HealthStore
    from fallgate.fsm.health import records as fleet
    from fallgate.providers import AsyncFallgate

    fault_server.script(
        {
            "models": {
                "a": [{"kind": "timeout", "seconds": 2}, {"kind": "answer"}, {"kind": "answer"}]
            }
        }
    )
    policy = chain("a", server=fault_server, attempt_timeout=1.0)
    health = HealthStore()
    key = policy.targets[0].key
    for _ in range(int(policy.retry_budget.size)):  # earlier retries drained the budget
        health._apply(key, lambda r, t: fleet.spend(r, policy), 0.0)

    async def main() -> tuple[list, int]:
        async with AsyncFallgate(policy, health=health) as gate:
            a = asyncio.ensure_future(gate.arun(messages=MSG))
            while not fault_server.requests:  # until A's request is in: the server holds it
                await asyncio.sleep(0.01)
            b = await gate.arun(messages=MSG)
            assert b.value.choices[0].message.content
            result = await a
            return list(result.trace), gate.clients.rebuilds

    trace, rebuilds = asyncio.run(main())
    assert [(e.event, e.action) for e in trace] == [
        ("start", "Attempt"),
        ("transport", "Wait"),
        ("waited", "Attempt"),
        ("success", "Finish"),
    ]
    assert rebuilds == 0
    assert "fails" not in health.record(key) and health.target_until(key) == 0.0
