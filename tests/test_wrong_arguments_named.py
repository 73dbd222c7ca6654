"""A wrong argument to the public API is refused where it is given, naming it: never a
bare error from inside fallgate, never a turn that fails (or benches a backend) for the
caller's mistake."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fallgate.fsm import HealthStore
from fallgate.providers import Fallgate
from fallgate.providers.testing import FaultServer

import fallgate

from helpers import chain

POLICY = fallgate.Policy.from_dict(
    {"primary": {"provider": "openai", "model": "g", "api_key": "sk-proj-SECRETSECRET12345678"}}
)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: fallgate.replay(None, POLICY), "turns"),
        (lambda: fallgate.replay(['{"v": 1}'], POLICY), "turns"),
        (lambda: fallgate.run(POLICY, lambda t, c: "ok", engine="bogus"), "engine"),
        (lambda: fallgate.run(POLICY, None, health=HealthStore()), "call"),
        (lambda: fallgate.check_policy({"primary": {"provider": "openai"}}), "policy"),
    ],
    ids=["replay-None", "replay-list-of-lines", "run-engine-str", "run-call-None", "check-dict"],
)
def test_a_wrong_argument_is_a_type_error_naming_it(make: Any, named: str) -> None:
    with pytest.raises(TypeError) as e:
        make()
    assert named in str(e.value), str(e.value)
    assert "SECRET" not in str(e.value)


def test_arun_given_a_plain_function_says_so_instead_of_failing_the_turn() -> None:
    def plain(target: Any, credential: Any) -> str:
        return "ok"

    health = HealthStore()
    with pytest.raises(TypeError, match="not an awaitable: give arun an async function"):
        asyncio.run(fallgate.arun(POLICY, plain, health=health))
    assert health.target_until(POLICY.targets[0].key) == 0.0


def test_recording_into_a_folder_that_does_not_exist_is_refused_at_once(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "turns.jsonl"
    try:
        with pytest.raises(FileNotFoundError, match="does not exist"):
            fallgate.record_traces(target)
    finally:
        fallgate.stop_recording()


def test_a_client_factory_that_is_not_callable_is_refused_when_the_client_is_made() -> None:
    with pytest.raises(TypeError, match="client_factory must be a callable"):
        Fallgate(POLICY, client_factory=5)  # type: ignore[arg-type]


def test_a_client_that_cannot_be_built_benches_no_backend_of_a_shared_store(
    tmp_path: Path,
) -> None:
    """A factory that raises is the process's own fault: the request never left, so the
    backend's breaker in the fleet's store stays closed for every other process."""

    def broken(target: Any, api_key: str) -> Any:
        raise RuntimeError("no certificate bundle here")

    with FaultServer() as srv:
        policy = chain("m0", server=srv, max_attempts=2)
        store = fallgate.SQLiteHealthStore(tmp_path / "h.db")
        with Fallgate(policy, health=store, client_factory=broken) as gate:
            for _ in range(4):
                with pytest.raises(fallgate.TurnFailed, match="could not be built"):
                    gate.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
        assert srv.counts == {}
        assert store.target_until(policy.targets[0].key) == 0.0  # its breaker never opened
        with Fallgate(policy, health=fallgate.SQLiteHealthStore(tmp_path / "h.db")) as healthy:
            reply = healthy.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
