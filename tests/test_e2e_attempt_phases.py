"""Each phase of an attempt has its own bound (connect, first byte / first event, total,
idle), named when it runs out; real SDK over real sockets to the fault server.

A silent provider is cut at the first-byte bound (or, streamed, the first-event bound)
and the fallback answers; once bytes flow, a non-streamed reply has its total; once a
stream has started, the idle bound between events, never the first-event bound.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fallgate.providers.openai.http.bounds import AttemptBound

from fallgate import Fallgate, Policy, PolicyError

from helpers import chain

MESSAGES = [{"role": "user", "content": "hi"}]
SLACK = 0.6  # a loaded 2-core machine
FAST = {"kind": "answer", "text": "fallback answer"}


def _policy(server: Any, **fields: Any) -> Policy:
    fields = {"max_attempts": 1, "recover_transport": False, "deadline": 6, **fields}
    return chain("slow", "fast", server=server, **fields)


def _primary_detail(trace: Any) -> str:
    e = next(e for e in trace if e.source == "primary" and e.event != "start")
    return str(e.detail)


def test_a_silent_primary_is_cut_at_the_first_byte_bound(fault_server):
    fault_server.script({"models": {"slow": [{"kind": "timeout", "seconds": 8}], "fast": [FAST]}})
    policy = _policy(fault_server, attempt_timeout=3, first_byte_timeout=0.4)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        result = gate.run(messages=MESSAGES)
        took = time.monotonic() - t0
    assert result.value.choices[0].message.content == "fallback answer"
    assert "no first byte within 0.4 s (first_byte_timeout)" in _primary_detail(result.trace)
    assert 0.4 <= took < 0.4 + SLACK


def test_once_the_reply_has_begun_only_its_total_bounds_it(fault_server):
    """Headers at once, then a body trickled over 8 s: past the first-byte bound (0.3 s)
    the reply is not cut until the attempt's total (1.2 s)."""
    trickle = {"kind": "trickle_body", "interval": 0.1, "seconds": 8}
    fault_server.script({"models": {"slow": [trickle], "fast": [FAST]}})
    policy = _policy(fault_server, attempt_timeout=1.2, first_byte_timeout=0.3)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        result = gate.run(messages=MESSAGES)
        took = time.monotonic() - t0
    assert "attempt exceeded its 1.2 s total time bound" in _primary_detail(result.trace)
    assert 1.2 <= took < 1.2 + SLACK


def test_a_stream_with_headers_but_no_event_is_cut_at_the_first_event_bound(fault_server):
    """200 and keep-alive comments, never an event (alive, yet silent): cut at
    first_event_timeout (0.4 s), well before attempt_timeout (3 s)."""
    alive = {"kind": "keepalive", "interval": 0.1, "seconds": 8}
    fault_server.script({"models": {"slow": [alive], "fast": [FAST]}})
    policy = _policy(fault_server, attempt_timeout=3, first_event_timeout=0.4)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
            text = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
            trace = s.trace
        took = time.monotonic() - t0
    assert text == "fallback answer"
    assert "no first event within 0.4 s (first_event_timeout)" in _primary_detail(trace)
    assert 0.4 <= took < 0.4 + SLACK


def test_a_started_stream_is_never_cut_at_the_first_event_bound(fault_server):
    """Events every 0.5 s (longer than first_event_timeout, 0.3 s, and together longer
    than attempt_timeout, 1 s), within the idle bound (1 s): the whole answer."""
    steady = {"kind": "stream", "chunks": 4, "interval": 0.5}
    fault_server.script({"models": {"slow": [steady], "fast": [FAST]}})
    policy = _policy(
        fault_server, attempt_timeout=1, first_event_timeout=0.3, stream_idle_timeout=1
    )
    with Fallgate(policy) as gate:
        with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
            text = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    assert text == "chunk-1 chunk-2 chunk-3 chunk-4 "
    assert fault_server.count("fast") == 0


def test_each_bound_is_capped_by_the_attempts_total():
    """A connect of at most connect_timeout; the first-byte bound no longer than the total."""
    b = AttemptBound(2.0, 1024, connect=0.25, first=300.0, first_field="first_byte_timeout")
    assert b.phase == "total"  # 300 s of first byte: the 2 s total binds
    assert b.limit(None, connecting=True) <= 0.25
    assert 1.9 < b.limit(None) <= 2.0
    c = AttemptBound(2.0, 1024, first=0.5, first_field="first_byte_timeout")
    assert c.phase == "first byte" and c.left() <= 0.5
    c.first_byte()
    assert c.phase == "total" and c.left() > 1.9


def test_the_worst_case_of_one_attempt():
    p = chain("a", "b", attempt_timeout=40, first_event_timeout=10)
    assert p.attempt_bound(p.targets[1]) == 40
    assert p.attempt_bound(p.targets[1], stream=True) == 10
    q = chain("a", attempt_timeout=5)  # first_event_timeout (30) is capped by the total
    assert q.attempt_bound(q.targets[0], stream=True) == 5


@pytest.mark.parametrize(
    "field", ["connect_timeout", "first_byte_timeout", "first_event_timeout", "attempt_timeout"]
)
def test_a_bad_bound_is_refused_naming_its_field_and_line(tmp_path, field):
    path = tmp_path / "policy.toml"
    path.write_text(
        f'{field} = -1\n[primary]\nprovider = "openai"\nmodel = "m"\nkey_env = "K"\n',
        encoding="utf-8",
    )
    with pytest.raises(PolicyError) as err:
        Policy.from_toml(path)
    text = str(err.value)
    assert f"{field} = -1" in text and "must be a finite number of seconds > 0" in text
    assert "line 1" in text or ":1" in text
