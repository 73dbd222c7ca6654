"""WARNINGs on the ``fallgate`` logger when it matters, once per change (fsm.host.notices):
real turns through the wrapper against the fault server."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from fallgate.fsm import TurnFailed
from fallgate.fsm.host import notices
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
NOT_FOUND = {
    "kind": "status",
    "status": 404,
    "body": {
        "error": {
            "message": "The model `gpt-4o-mnii` does not exist",
            "type": "invalid_request_error",
            "code": "model_not_found",
        }
    },
}


@pytest.fixture(autouse=True)
def fresh(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    notices.forget()
    caplog.set_level(logging.INFO, logger="fallgate")
    yield
    notices.forget()


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fallgate" and r.levelno == level]


def test_a_fallback_is_one_warning_with_its_reason_not_one_per_turn(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    limited = {"kind": "status", "status": 429, "headers": {"retry-after": "1"}}
    fault_server.script({"models": {"a": [limited] * 5}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        for _ in range(3):
            assert gate.chat.completions.create(messages=MSG).model == "b"
        warnings = said(caplog, logging.WARNING)
        falls = [w for w in warnings if "falling back" in w]
        assert falls == [
            "fallgate: falling back from primary (fault/a) to fallback_1 (fault/b): "
            "rate_limited (HTTP 429), Retry-After 1s: scripted HTTP 429"
        ]
        benched = [w for w in warnings if "benched" in w]
        assert len(benched) == 1
        assert benched[0].startswith("fallgate: primary (fault/a)'s key key#1 is benched for")
        assert benched[0].endswith("s: rate_limited (HTTP 429)")
        fault_server.script({})  # the primary answers again, once its 1 s bench is over
        time.sleep(1.05)
        caplog.clear()
        assert gate.chat.completions.create(messages=MSG).model == "a"
    assert said(caplog, logging.INFO)[-1].startswith("fallgate: primary (fault/a) answers again")


def test_a_404_model_not_found_on_a_target_that_never_answered_is_a_configuration_error(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    fault_server.script({"models": {"gpt-4o-mnii": [NOT_FOUND] * 5}})
    with Fallgate(chain("gpt-4o-mnii", "b", server=fault_server)) as gate:
        assert gate.chat.completions.create(messages=MSG).model == "b"
    errors = said(caplog, logging.ERROR)
    assert len(errors) == 1
    assert "primary (fault/gpt-4o-mnii) answered not_found before it ever answered" in errors[0]
    assert "check its model name" in errors[0]
    warnings = said(caplog, logging.WARNING)
    assert any("breaker is open" in w and "not_found" in w for w in warnings), warnings


def test_a_404_after_the_target_answered_is_no_typo(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    fault_server.script({"models": {"a": [{"kind": "answer", "text": "fine"}, NOT_FOUND]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        assert gate.chat.completions.create(messages=MSG).model == "a"
        assert gate.chat.completions.create(messages=MSG).model == "b"
    assert said(caplog, logging.ERROR) == []


def test_a_happy_turn_says_nothing(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        for _ in range(3):
            gate.chat.completions.create(messages=MSG)
    assert [r for r in caplog.records if r.name == "fallgate" and r.levelno >= logging.INFO] == []


def test_a_turn_that_enters_no_target_still_fails_as_a_turn(fault_server: FaultServer) -> None:
    limited = {"kind": "status", "status": 429, "headers": {"retry-after": "60"}}
    fault_server.script({"models": {"a": [limited]}})
    with Fallgate(chain("a", server=fault_server)) as gate:
        with pytest.raises(TurnFailed, match="rate_limited"):
            gate.chat.completions.create(messages=MSG)  # a's only key: benched for 60 s
        with pytest.raises(TurnFailed, match="cooling"):
            gate.chat.completions.create(messages=MSG)  # nothing to enter; no notice breaks
    assert fault_server.counts == {"a": 1}


def test_a_turn_with_nothing_new_to_report_is_read_without_building_its_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reading a finished turn for news builds no `TraceEvent` (nor its detail text) when
    there is none: the second turn falling back for the same reason says nothing, and
    its trace is still unbuilt when the turn returns."""
    from fallgate.fsm import HealthStore, Policy, Target, VirtualClock, run
    from fallgate.fsm.policy.model import Credential

    policy = Policy(
        [
            Target("p", "a", "http://127.0.0.1:9/v1", credentials=[Credential.literal("sk-a")]),
            Target("p", "b", "http://127.0.0.1:9/v1", credentials=[Credential.literal("sk-b")]),
        ],
        max_attempts=1,
    )

    class Unavailable(Exception):
        status_code = 503

    def call(target: Target, _: Credential) -> str:
        if target.model == "a":
            raise Unavailable("service unavailable")
        return "ok"

    ends = [run(policy, call, clock=VirtualClock(), health=HealthStore()) for _ in range(2)]
    assert [e.model for e in ends] == ["b", "b"]
    falls = [w for w in said(caplog, logging.WARNING) if "falling back" in w]
    assert len(falls) == 1, falls
    assert ends[1]._turn._events == []  # read from the raw record only
    assert [e.event for e in ends[1].trace][:2] == ["start", "overloaded"]  # still all there
