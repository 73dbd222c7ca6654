"""The fault server's slow kinds (trickle_headers, trickle_body, keepalive, endless, and
a stream ending in keep-alives): what they send on the wire, and their named errors.

What the client sees is read off a raw socket, so each test shows the server really
trickles (not the client's reading of it)."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
from fallgate.providers.testing.fault_server import ScriptError, parse_script


def _post(server, body: dict, *, read_until: bytes | None = None, limit: int = 1 << 22):
    """POST `body` to /v1/chat/completions on a raw socket; returns [(seconds, bytes)]
    for every recv until the server closes (or `read_until` / `limit` is reached)."""
    host, port = server.base_url.split("//")[1].split("/")[0].split(":")
    payload = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer sk-test\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    got: list[tuple[float, bytes]] = []
    t0, total = time.monotonic(), 0
    try:
        while total < limit:
            data = s.recv(65536)
            if not data:
                break
            got.append((time.monotonic() - t0, data))
            total += len(data)
            if read_until and read_until in b"".join(d for _, d in got):
                break
    finally:
        s.close()
    return got


def _joined(got) -> bytes:
    return b"".join(d for _, d in got)


ASK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_trickle_headers_sends_the_head_a_byte_at_a_time_then_the_answer(fault_server):
    fault_server.script(
        {"models": {"m": [{"kind": "trickle_headers", "interval": 0.02, "seconds": 0.5}]}}
    )
    got = _post(fault_server, ASK)
    raw = _joined(got)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"X-Trickle: " in head
    seen, when_head_done = b"", 0.0
    for t, data in got:
        seen += data
        if b"\r\n\r\n" in seen:
            when_head_done = t
            break
    assert when_head_done >= 0.4, "the head came at once"
    assert json.loads(body)["choices"][0]["message"]["content"] == "ok"


def test_trickle_body_sends_headers_at_once_then_the_body_in_pieces(fault_server):
    fault_server.script(
        {
            "models": {
                "m": [{"kind": "trickle_body", "text": "slow", "interval": 0.001, "seconds": 0.5}]
            }
        }
    )
    got = _post(fault_server, ASK)
    first = got[0][1]
    assert first.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in first
    assert len(got) >= 10 and got[-1][0] >= 0.4, "the body came at once"
    body = _joined(got).partition(b"\r\n\r\n")[2]
    assert body[:1] == b" " and json.loads(body)["choices"][0]["message"]["content"] == "slow"


def test_a_per_read_timeout_never_fires_on_a_trickled_body(fault_server):
    """Why fallgate needs its own bound: the bare SDK with a 0.3 s timeout waits out a
    body that trickles for 1.5 s, one byte every 0.05 s."""
    fault_server.script(
        {"models": {"m": [{"kind": "trickle_body", "interval": 0.05, "seconds": 1.5}]}}
    )
    client = openai.OpenAI(base_url=fault_server.base_url, api_key="sk-test", max_retries=0)
    with client:
        t0 = time.monotonic()
        reply = client.chat.completions.create(timeout=0.3, **ASK)
        took = time.monotonic() - t0
    assert reply.choices[0].message.content == "ok"
    assert took >= 1.4


def test_keepalive_on_a_stream_sends_comments_before_the_first_event(fault_server):
    fault_server.script(
        {"models": {"m": [{"kind": "keepalive", "text": "a b", "interval": 0.05, "seconds": 0.3}]}}
    )
    raw = _joined(_post(fault_server, {**ASK, "stream": True}))
    body = raw.partition(b"\r\n\r\n")[2]
    assert body.count(b": keep-alive") >= 5
    assert body.index(b": keep-alive") < body.index(b"data: ")
    assert b"data: [DONE]" in body


def test_keepalive_on_a_plain_request_sends_newlines_before_the_json(fault_server):
    fault_server.script(
        {"models": {"m": [{"kind": "keepalive", "interval": 0.05, "seconds": 0.3}]}}
    )
    client = openai.OpenAI(base_url=fault_server.base_url, api_key="sk-test", max_retries=0)
    with client:
        raw = client.chat.completions.with_raw_response.create(**ASK)
    assert raw.http_response.content.startswith(b"\n\n\n")
    assert raw.parse().choices[0].message.content == "ok"


def test_endless_sends_padding_until_its_seconds_pass(fault_server):
    # a piece every millisecond: unpaced, an idle machine sent the 1 GiB read limit in
    # 0.17 s, and the read stopped there, before the 0.3 s were up
    step = {"kind": "endless", "bytes": 4096, "seconds": 0.3, "interval": 0.001}
    fault_server.script({"models": {"m": [step]}})
    got = _post(fault_server, ASK, limit=1 << 30)
    raw = _joined(got)
    assert raw.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in raw
    assert len(raw) > 100_000, "far more than any reply"
    assert b"choices" not in raw
    assert got[-1][0] >= 0.25


def test_a_stream_can_end_in_keepalives_after_its_content(fault_server):
    step = {"kind": "stream", "chunks": 2, "then": "keepalive", "seconds": 0.5}
    fault_server.script({"models": {"m": [step]}})
    body = _joined(_post(fault_server, {**ASK, "stream": True})).partition(b"\r\n\r\n")[2]
    assert body.index(b"chunk-2") < body.index(b": keep-alive")
    assert b"[DONE]" not in body


@pytest.mark.parametrize(
    ("step", "where", "says"),
    [
        (
            {"kind": "trickle_body", "interval": 0},
            '["m"][0].interval',
            "expected a positive interval",
        ),
        ({"kind": "keepalive", "interval": -1}, '["m"][0].interval', "expected seconds between 0"),
        ({"kind": "endless", "bytes": 0}, '["m"][0].bytes', "piece size between 1 and 16777216"),
        ({"kind": "endless", "bytes": 1 << 30}, '["m"][0].bytes', "piece size between 1"),
        ({"kind": "endless", "bytes": "64k"}, '["m"][0].bytes', "expected a whole number of bytes"),
        ({"kind": "endless", "bytes": True}, '["m"][0].bytes', "expected a whole number of bytes"),
        ({"kind": "trickle_headers", "seconds": 1e9}, '["m"][0].seconds', "between 0 and 3600"),
        ({"kind": "endless", "text": "x"}, '["m"][0].text', "unknown field for kind 'endless'"),
        (
            {"kind": "keepalive", "chunks": 3},
            '["m"][0].chunks',
            "unknown field for kind 'keepalive'",
        ),
        ({"kind": "stream", "then": "trickle"}, '["m"][0].then', "keepalive"),
        (  # a byte of padding per piece, built at once: 3.6e12 of them ran out of memory
            {"kind": "trickle_headers", "interval": 1e-9, "seconds": 3600},
            '["m"][0].interval',
            "at most 1,000,000 (raise interval or lower seconds)",
        ),
        (
            {"kind": "keepalive", "interval": 1e-5},
            '["m"][0].interval',
            "a trickle of 30 s every 1e-05 s is 3e+06 pieces",
        ),
    ],
)
def test_bad_slow_steps_are_named(step, where, says):
    with pytest.raises(ScriptError) as err:
        parse_script({"models": {"m": [step]}})
    assert f"models{where}" in str(err.value)
    assert says in str(err.value)


def test_slow_steps_describe_themselves():
    script = parse_script({"models": {"m": [{"kind": "trickle_body"}, {"kind": "endless"}]}})
    assert "m: trickle_body every 0.4s for 30s, endless every 0s for 30s" in script.summary()
