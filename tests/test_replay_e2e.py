"""A real recording: the real `openai` SDK over HTTP against the fault server, recorded
with `fallgate.record_traces`, then replayed (`fallgate.replay`)."""

from __future__ import annotations

import json
from pathlib import Path

from fallgate.fsm import instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

import fallgate

from helpers import KEY_PREFIX, chain

MSG = [{"role": "user", "content": "hi"}]
INCIDENT = {
    "models": {
        "glm-5.1": [
            {"kind": "status", "status": 429, "headers": {"retry-after": "20"}},
            {"kind": "answer", "text": "answered by glm-5.1"},
        ],
        "glm-4.7": [{"kind": "answer", "text": "answered by glm-4.7"}],
    }
}


def test_an_incident_recorded_with_the_real_sdk_replays_faster_under_the_default_rules(
    fault_server: FaultServer, tmp_path: Path
) -> None:
    fault_server.script(INCIDENT)
    waiting = chain(
        "glm-5.1", "glm-4.7", server=fault_server, prefer_waiting=True, retry_after_cap=30
    )
    out = tmp_path / "incident.jsonl"
    # virtual time: the 20 s Retry-After is waited out at once
    with instant_waits(), fallgate.record_traces(out), Fallgate(waiting) as gate:
        reply = gate.chat.completions.create(messages=MSG)
    assert reply.choices[0].message.content == "answered by glm-5.1"
    assert fault_server.counts == {"glm-5.1": 2}
    text = out.read_text()
    assert KEY_PREFIX not in text
    head = json.loads(text.splitlines()[0])
    assert head["v"] == 1 and head["targets"][0]["endpoint"] == fault_server.base_url
    assert [t["credentials"] for t in head["targets"]] == [["key#1"], ["key#1"]]

    # under the recording policy: the recording, exactly (virtual time)
    same = fallgate.replay(text, waiting)
    (t,) = same.turns
    assert t.same_path and t.assumptions == ()
    assert t.replayed.seconds == t.recorded.seconds >= 20
    assert t.replayed.waits == t.recorded.waits

    # under the default rules: the fallback at once, which the recording never asked
    default = chain("glm-5.1", "glm-4.7", server=fault_server)
    report = fallgate.replay(text, default, assume={"fallback_1": "success:0.4"})
    (t,) = report.turns
    assert t.recorded.requests == {"glm-5.1": 2}
    assert t.replayed.requests == {"glm-5.1": 1, "glm-4.7": 1}
    assert t.replayed.seconds == 0.4 and t.replayed.end == "done"
    assert [(a.target, a.what) for a in report.assumptions] == [
        ("fallback_1", "assumed success:0.4 (given)")
    ]
    # without an assumption for it, the never-recorded fallback stops the turn, said so
    (t,) = fallgate.replay(text, default).turns
    assert t.replayed.end == "unknown" and "glm-4.7" in (t.stopped or "")
