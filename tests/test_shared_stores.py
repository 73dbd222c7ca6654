"""`fallgate.SQLiteHealthStore` and `fallgate.RedisHealthStore` as ``health=`` of every
entry point (`run`, `arun`, `Fallgate`, `AsyncFallgate`): what one store object learns,
another object on the same file or server knows — as two processes would.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from fallgate.fsm import Policy, Target
from fallgate.fsm.health.shared_store import SharedHealthStore
from fallgate.fsm.policy.model import Credential
from fallgate.providers.testing.fault_server import FaultServer

import fallgate

Make = Callable[[], SharedHealthStore]


class HTTPError(Exception):
    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code, self.headers = status_code, headers or {}


def chain(base_url: str = "http://127.0.0.1:9/v1") -> Policy:
    return Policy(
        targets=[
            Target("fault", "primary", base_url, credentials=[Credential.literal("sk-p-SECRET")]),
            Target("fault", "fallback", base_url, credentials=[Credential.literal("sk-f")]),
        ],
        max_attempts=1,
    )


@pytest.fixture(params=["sqlite", "redis"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """A factory of store objects on one file or server (each as a process holds it)."""
    made: list[SharedHealthStore] = []

    def make() -> SharedHealthStore:
        if request.param == "sqlite":
            store: SharedHealthStore = fallgate.SQLiteHealthStore(tmp_path / "health.db")
        else:
            store = fallgate.RedisHealthStore(request.getfixturevalue("redis_server").url)
        made.append(store)
        return store

    yield make
    for store in made:
        store.backend.close()


def rate_limited_primary(seen: list[str]) -> Callable[[Target, Credential], str]:
    def call(target: Target, credential: Credential) -> str:
        seen.append(target.model)
        if target.model == "primary":
            raise HTTPError(429, {"retry-after": "20"})
        return f"answer from {target.model}"

    return call


def test_run_what_one_store_learns_another_on_the_same_store_knows(stores: Make) -> None:
    policy, seen = chain(), []
    first = fallgate.run(policy, rate_limited_primary(seen), health=stores())
    second = fallgate.run(policy, rate_limited_primary(seen), health=stores())
    assert (first.value, second.value) == ("answer from fallback", "answer from fallback")
    assert seen == ["primary", "fallback", "fallback"]  # the second skipped the primary


def test_arun_shares_the_same_way(stores: Make) -> None:
    policy, seen = chain(), []
    call = rate_limited_primary(seen)

    async def acall(target: Target, credential: Credential) -> str:
        return call(target, credential)

    async def main() -> tuple[Any, Any]:
        a = await fallgate.arun(policy, acall, health=stores())
        b = await fallgate.arun(policy, acall, health=stores())
        return a, b

    a, b = asyncio.run(main())
    assert (a.value, b.value) == ("answer from fallback", "answer from fallback")
    assert seen == ["primary", "fallback", "fallback"]


RATE_LIMITED = {"kind": "status", "status": 429, "headers": {"retry-after": "20"}}


def test_fallgate_and_async_fallgate_share_through_the_store(
    stores: Make, fault_server: FaultServer
) -> None:
    fault_server.script({"models": {"primary": [RATE_LIMITED] * 10}})
    policy = chain(fault_server.base_url)
    messages = [{"role": "user", "content": "hi"}]
    with fallgate.Fallgate(policy, health=stores()) as client:
        assert client.chat.completions.create(messages=messages).model == "fallback"

    async def main() -> str:
        async with fallgate.AsyncFallgate(policy, health=stores()) as aclient:
            reply = await aclient.chat.completions.create(messages=messages)
            return str(reply.model)

    assert asyncio.run(main()) == "fallback"
    assert fault_server.counts == {"primary": 1, "fallback": 2}


def test_the_stores_name_their_place_never_a_password(redis_server: Any, tmp_path: Path) -> None:
    sqlite = fallgate.SQLiteHealthStore(tmp_path / "h.db")
    assert repr(sqlite) == f"SQLiteHealthStore('sqlite:///{tmp_path / 'h.db'}')"
    url = redis_server.url.replace("redis://", "redis://:pw-SECRET@")
    redis_store = fallgate.RedisHealthStore(url)
    assert "pw-SECRET" not in repr(redis_store) and "***" in repr(redis_store)
    assert isinstance(sqlite, fallgate.HealthStore) and isinstance(redis_store, SharedHealthStore)
    sqlite.backend.close()
    redis_store.backend.close()


def test_a_redis_store_is_made_while_the_server_is_down_and_turns_go_on(redis_server: Any) -> None:
    redis_server.stop()
    store = fallgate.RedisHealthStore(redis_server.url)  # never connects here
    seen: list[str] = []
    result = fallgate.run(chain(), rate_limited_primary(seen), health=store)
    assert result.value == "answer from fallback"
    store.backend.close()


def test_importing_fallgate_imports_neither_the_stores_nor_redis() -> None:
    code = (
        "import sys, fallgate; "
        "assert 'redis' not in sys.modules, 'redis'; "
        "assert 'fallgate.providers.stores' not in sys.modules, 'stores'; "
        "fallgate.SQLiteHealthStore; assert 'redis' not in sys.modules, 'redis after sqlite'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_without_the_redis_package_the_error_says_which_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import fallgate\n"
        "try:\n"
        "    fallgate.RedisHealthStore('redis://127.0.0.1:1/0')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'fallgate[redis]'" in out.stdout, out.stderr


@pytest.mark.parametrize("deadline", [1.0, 0.3])
def test_a_stuck_redis_costs_a_turn_one_timeout_and_never_a_targets_blame(
    redis_server: Any, fault_server: FaultServer, deadline: float
) -> None:
    """Redis stuck, not down (it accepts connections and answers nothing): the store's
    exchange gives up after its one timeout (0.5 s), not one for setting up its change
    feed and another for the command. A 1 s turn then still answers, on local health; a
    turn the exchange left no time fails saying so, and its primary is not blamed for a
    timeout it never had (no request was made, no fault counted against it)."""
    policy = attrs.evolve(chain(fault_server.base_url), deadline=deadline)
    with redis_server.frozen(), fallgate.Fallgate(
        policy, health=fallgate.RedisHealthStore(redis_server.url)
    ) as client:
        started = time.monotonic()
        try:
            reply = client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
        except fallgate.TurnFailed as e:
            assert deadline < 0.5, f"a {deadline} s turn failed: {e}"
            assert f"the rest of the {deadline:g}s deadline went before the attempt" in str(e)
            assert "transport" not in str(e), "the primary is not blamed"
            assert fault_server.counts == {}, "no request went out"
        else:
            assert deadline >= 0.5 and reply.model == "primary"
        took = time.monotonic() - started
    assert took < 0.5 + 0.2 + (deadline if deadline >= 0.5 else 0), took


def test_a_breaker_opened_before_a_verdict_wait_lets_the_probe_through_after_one_span(
    stores: Make,
) -> None:
    """A spent retry budget opens the breaker and the turn waits for its verdict; the
    change reaches the shared store at the next exchange, after the wait, but is replayed
    at the time it was made: the span ends with the wait and the probe goes, as on the
    in-memory store (it used to open a second span from the exchange: 10 s, not 5)."""
    policy = Policy.from_dict(
        {
            "primary": {"provider": "local", "model": "m", "base_url": "http://127.0.0.1:9/v1",
                        "keyless": True},
            "max_attempts": 3,
            "backoff": {"initial": 0.01, "cap": 0.01},
            "retry_budget": {"size": 1, "refill": 0.2},
        }
    )  # fmt: skip

    def once_overloaded() -> Callable[[Any, Any], str]:
        calls = iter([HTTPError(503)])

        def call(target: Any, cred: Any) -> str:
            e = next(calls, None)
            if e is not None:
                raise e
            return "ok"

        return call

    def two_turns(health: Any) -> tuple[list[str], float]:
        clock = fallgate.fsm.VirtualClock()
        fallgate.run(policy, once_overloaded(), health=health, clock=clock)  # spends the token
        t0 = clock.now()
        r = fallgate.run(policy, once_overloaded(), health=health, clock=clock)
        return [e.event for e in r.trace], clock.now() - t0

    local = two_turns(fallgate.HealthStore())
    assert local[0] == ["start", "overloaded", "waited", "success"] and 5 <= local[1] < 6
    shared = two_turns(stores())
    assert shared[0] == local[0], shared
    assert shared[1] < 6, shared
