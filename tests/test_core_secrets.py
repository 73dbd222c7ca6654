"""Property 9 at the core: a key never reaches a trace, log, repr or exception text."""

from __future__ import annotations

import logging

import pytest
from fallgate.fsm import HealthStore, TurnFailed, instant_waits, run
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import FAULT_KINDS, OutcomeKind
from fallgate.fsm.trace import to_jsonl

from helpers import chain

KEY = "sk-live-9f8e7d6c5b4a3f2e1d0c"
ENV_KEY = "sk-live-ENVSECRET-0123456789"

STATUS_FOR = {
    OutcomeKind.TRANSPORT: 408,
    OutcomeKind.RATE_LIMITED: 429,
    OutcomeKind.QUOTA: 402,
    OutcomeKind.OVERLOADED: 503,
    OutcomeKind.AUTH: 401,
    OutcomeKind.NOT_FOUND: 404,
    OutcomeKind.CONTEXT_TOO_LONG: 413,
    OutcomeKind.CONTENT_FILTERED: 400,
    OutcomeKind.BAD_REQUEST: 400,
    OutcomeKind.STREAM_INTERRUPTED: 400,
}


class Leaky(Exception):
    """A provider error that echoes the key, as some APIs do."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(body)
        self.status_code = status
        self.body = body
        self.headers = {"retry-after": "1"}


#: One literal key and one read from the environment (set per test).
POLICY = chain({"model": "m", "api_key": KEY}, {"model": "n", "key_env": "FALLGATE_SECRET"})


@pytest.mark.parametrize("kind", FAULT_KINDS, ids=lambda k: k.value)
def test_a_key_turned_through_every_outcome_class_appears_nowhere(kind, caplog, monkeypatch):
    monkeypatch.setenv("FALLGATE_SECRET", ENV_KEY)
    body = f'{{"error": {{"message": "Incorrect API key provided: {KEY} / {ENV_KEY}"}}}}'
    if kind is OutcomeKind.CONTENT_FILTERED:
        body = body.replace("Incorrect", "content_filter triggered; Incorrect")
    seen: list[str] = []

    def call(target, credential):
        seen.append(credential.resolve(target.name))
        raise Leaky(STATUS_FOR[kind], body)

    caplog.set_level(logging.DEBUG, logger="fallgate")
    texts: list[str] = [repr(POLICY), str(POLICY)]
    with instant_waits():
        try:
            result = run(
                POLICY, call, health=HealthStore(), on_transition=lambda e: texts.append(repr(e))
            )
            texts += [repr(result), to_jsonl(result.trace)]
        except TurnFailed as e:
            texts += [str(e), repr(e), repr(e.reasons), to_jsonl(e.trace), repr(e.last_outcome)]
    for rec in caplog.records:
        texts += [rec.getMessage(), repr(rec.__dict__)]
    assert KEY in seen  # the key really was used
    assert caplog.records  # and the transitions really were logged
    joined = "\n".join(texts)
    assert KEY not in joined
    assert ENV_KEY not in joined
    assert "9f8e7d6c5b4a" not in joined


def test_scripted_core_turns_never_carry_key_material():
    played = play(POLICY, ["auth", "rate_limited:3", "success"])
    assert KEY not in repr(played)
    assert KEY not in to_jsonl(played.trace)
