"""providers.openai.exceptions: what the real openai SDK raises, over real HTTP, becomes an Outcome.

One test (at least) per row of the outcome table in docs/design.md. Every exception here
is produced by the real SDK talking to the fault server on loopback, except
cancellation, which no server can produce (constructed directly).
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import OutcomeKind
from fallgate.fsm.errors import MissingCredential
from fallgate.providers.openai.exceptions import (
    ClientUnavailable,
    MalformedReply,
    StreamInterrupted,
    classify_openai,
    scrub,
)
from fallgate.providers.openai.http import transport
from fallgate.providers.openai.http.pools import shared_ssl_context
from fallgate.providers.testing.fault_server import FaultServer

MSG = [{"role": "user", "content": "hi"}]
KEY = "sk-test-0123456789abcdef"


def _error(body: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"param": None, "code": None, "type": "invalid_request_error", **body}}


class Caller:
    """Real SDK clients (one per key, retries off) against one fault server."""

    def __init__(self, srv: FaultServer) -> None:
        self.srv = srv
        self.http = transport.DefaultClient(verify=shared_ssl_context())
        self.clients: dict[str, openai.OpenAI] = {}

    def client(self, key: str) -> openai.OpenAI:
        if key not in self.clients:
            self.clients[key] = openai.OpenAI(
                base_url=self.srv.base_url,
                api_key=key,
                max_retries=0,
                timeout=0.25,
                http_client=self.http,
            )
        return self.clients[key]

    def error(self, step: dict[str, Any], *, stream: bool = False, key: str = KEY) -> BaseException:
        """Script one step, make one real SDK call, return what the SDK raised."""
        self.srv.script({"models": {"m": [step]}})
        c = self.client(key)
        try:
            if stream:
                for _ in c.chat.completions.create(model="m", messages=MSG, stream=True):
                    pass
            else:
                c.chat.completions.create(model="m", messages=MSG)
        except Exception as e:
            return e
        raise AssertionError(f"the SDK did not raise for {step}")


@pytest.fixture(scope="module")
def sdk() -> Iterator[Caller]:
    """One server and one set of clients for the module; each test sets its own script."""
    with FaultServer() as srv:
        caller = Caller(srv)
        yield caller
        caller.http.close()


def status(code: int, body: Any = None, **headers: str) -> dict[str, Any]:
    step: dict[str, Any] = {"kind": "status", "status": code}
    if body is not None:
        step["body"] = body
    if headers:
        step["headers"] = {k.replace("_", "-"): v for k, v in headers.items()}
    return step


# -- the outcome table (docs/design.md), row by row ---------------------------------------------

ROWS = [
    # rate limited
    ("429 with Retry-After", status(429, retry_after="171"), OutcomeKind.RATE_LIMITED, 429),
    ("429 without Retry-After", status(429), OutcomeKind.RATE_LIMITED, 429),
    # quota / billing
    (
        "429 insufficient_quota",
        status(
            429,
            _error(
                {
                    "message": "You exceeded your current quota, please check your plan.",
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                }
            ),
        ),
        OutcomeKind.QUOTA,
        429,
    ),
    ("402 payment required", status(402), OutcomeKind.QUOTA, 402),
    # overloaded / server error
    ("500", status(500), OutcomeKind.OVERLOADED, 500),
    (
        "502 HTML page",
        {
            "kind": "status",
            "status": 502,
            "body": "<html><body><h1>502 Bad Gateway</h1></body></html>",
            "content_type": "text/html",
        },
        OutcomeKind.OVERLOADED,
        502,
    ),
    ("503", status(503), OutcomeKind.OVERLOADED, 503),
    ("504", status(504), OutcomeKind.OVERLOADED, 504),
    ("529", status(529), OutcomeKind.OVERLOADED, 529),
    (
        "429 overloaded body",
        status(429, _error({"message": "The engine is currently overloaded, try later"})),
        OutcomeKind.OVERLOADED,
        429,
    ),
    # auth
    ("401", status(401), OutcomeKind.AUTH, 401),
    ("403", status(403), OutcomeKind.AUTH, 403),
    # model not found / unsupported
    (
        "404 model",
        status(
            404,
            _error({"message": "The model `m` does not exist", "code": "model_not_found"}),
        ),
        OutcomeKind.NOT_FOUND,
        404,
    ),
    (
        "400 unknown model",
        status(400, _error({"message": "Unknown model: m"})),
        OutcomeKind.NOT_FOUND,
        400,
    ),
    # context too long
    (
        "400 context_length_exceeded",
        status(
            400,
            _error(
                {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "code": "context_length_exceeded",
                }
            ),
        ),
        OutcomeKind.CONTEXT_TOO_LONG,
        400,
    ),
    # content filtered
    (
        "400 content policy",
        status(
            400,
            _error(
                {
                    "message": "Your request was rejected by our safety system",
                    "code": "content_policy_violation",
                }
            ),
        ),
        OutcomeKind.CONTENT_FILTERED,
        400,
    ),
    (
        "400 azure content_filter",
        status(400, _error({"message": "filtered", "code": "content_filter"})),
        OutcomeKind.CONTENT_FILTERED,
        400,
    ),
    # bad request
    (
        "400 other",
        status(400, _error({"message": "'messages' must not be empty"})),
        OutcomeKind.BAD_REQUEST,
        400,
    ),
    ("422", status(422), OutcomeKind.BAD_REQUEST, 422),
    ("other 4xx (417)", status(417), OutcomeKind.BAD_REQUEST, 417),
    # statuses that are no malformed request (they were bad_request: no fallback)
    ("418 (a proxy or bot filter)", status(418), OutcomeKind.NOT_FOUND, 418),
    ("451 (unavailable for legal reasons)", status(451), OutcomeKind.NOT_FOUND, 451),
    ("420 (enhance your calm)", status(420), OutcomeKind.RATE_LIMITED, 420),
    ("425 (too early)", status(425), OutcomeKind.OVERLOADED, 425),
    ("499 (client closed request)", status(499), OutcomeKind.TRANSPORT, 499),
]


@pytest.mark.parametrize(("name", "step", "kind", "code"), ROWS, ids=[r[0] for r in ROWS])
def test_status_rows_of_the_table(
    sdk: Caller, name: str, step: dict[str, Any], kind: OutcomeKind, code: int
) -> None:
    e = sdk.error(step)
    assert isinstance(e, openai.APIStatusError)
    o = classify_openai(e)
    assert (o.kind, o.status) == (kind, code), o
    assert o.error is e
    assert o.detail and len(o.detail) <= 200


def test_an_html_error_page_is_summarised_not_dumped(sdk: Caller) -> None:
    e = sdk.error(ROWS[5][1])
    assert classify_openai(e).detail == "HTML error page"


TRANSPORT_ROWS = [
    ("read timeout", {"kind": "timeout", "seconds": 2}, "timeout (ReadTimeout)"),
    ("connection dropped", {"kind": "drop"}, "RemoteProtocolError"),
    ("dropped mid body", {"kind": "drop_mid_body"}, "RemoteProtocolError"),
]


@pytest.mark.parametrize(
    ("name", "step", "detail"), TRANSPORT_ROWS, ids=[r[0] for r in TRANSPORT_ROWS]
)
def test_transport_rows_of_the_table(
    sdk: Caller, name: str, step: dict[str, Any], detail: str
) -> None:
    e = sdk.error(step)
    assert isinstance(e, openai.APIConnectionError)
    o = classify_openai(e)
    assert o.kind is OutcomeKind.TRANSPORT
    assert detail in o.detail


def test_connection_refused_is_transport() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=1
    ) as c:
        with pytest.raises(openai.APIConnectionError) as info:
            c.chat.completions.create(model="m", messages=MSG)
    o = classify_openai(info.value)
    assert o.kind is OutcomeKind.TRANSPORT
    assert "ConnectError" in o.detail


def test_a_stream_cut_before_its_first_chunk_is_transport(sdk: Caller) -> None:
    e = sdk.error({"kind": "stream", "chunks": 0, "then": "cut"}, stream=True)
    o = classify_openai(e)
    assert o.kind is OutcomeKind.TRANSPORT
    assert "incomplete chunked read" in o.detail


def test_a_stream_error_event_is_a_server_error(sdk: Caller) -> None:
    e = sdk.error({"kind": "stream", "chunks": 0, "then": "error"}, stream=True)
    assert type(e) is openai.APIError  # no status: an SSE error event
    o = classify_openai(e)
    assert o.kind is OutcomeKind.OVERLOADED
    assert "scripted stream error" in o.detail


def test_a_stream_error_event_saying_rate_limit_is_rate_limited(sdk: Caller) -> None:
    step = {
        "kind": "stream",
        "chunks": 0,
        "then": "error",
        "error": {"message": "Rate limit reached", "type": "rate_limit_error"},
    }
    o = classify_openai(sdk.error(step, stream=True))
    assert o.kind is OutcomeKind.RATE_LIMITED


def test_a_stream_broken_after_delivery_is_stream_interrupted(sdk: Caller) -> None:
    cause = sdk.error({"kind": "stream", "chunks": 3, "then": "cut"}, stream=True)
    o = classify_openai(StreamInterrupted("chunk-1 chunk-2 chunk-3 ", 3, cause))
    assert o.kind is OutcomeKind.STREAM_INTERRUPTED
    assert o.partial == "chunk-1 chunk-2 chunk-3 "
    assert "after 3 chunks, 24 characters delivered" in o.detail and "transport" in o.detail
    ended = classify_openai(StreamInterrupted("abc", 1))
    assert ended.kind is OutcomeKind.STREAM_INTERRUPTED
    assert "ended before its finish_reason" in ended.detail
    assert "after 1 chunk, 3 characters delivered" in ended.detail
    one = StreamInterrupted("a", 1)
    assert "after 1 chunk, 1 character delivered" in str(one)


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), KeyboardInterrupt()])
def test_cancellation_is_cancelled(exc: BaseException) -> None:
    assert classify_openai(exc).kind is OutcomeKind.CANCELLED


# -- malformed 2xx replies --------------------------------------------------------------------


@pytest.mark.parametrize(
    "step", [{"kind": "invalid_json"}, {"kind": "empty"}], ids=["invalid JSON", "empty body"]
)
def test_malformed_200_replies_are_server_errors(sdk: Caller, step: dict[str, Any]) -> None:
    e = sdk.error(step)
    o = classify_openai(e)
    assert (o.kind, o.status) == (OutcomeKind.OVERLOADED, 200)
    assert o.detail.startswith("malformed reply: not valid JSON")


def test_our_own_malformed_reply_is_a_server_error() -> None:
    o = classify_openai(MalformedReply("a chat completion without choices"))
    assert (o.kind, o.status) == (OutcomeKind.OVERLOADED, 200)
    assert "without choices" in o.detail


# -- Retry-After and x-should-retry --------------------------------------------------------------

NOW = 1_900_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "171"}, 171.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        ({"retry-after": email.utils.formatdate(NOW - 30, usegmt=True)}, 0.0),
        ({"retry-after": "1e308"}, 86_400.0),
        ({"retry-after": "99999999999999999999"}, 86_400.0),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": "NaN"}, None),
        ({"retry-after": "soon, honestly"}, None),
        ({"retry-after": ""}, None),
    ],
    ids=lambda v: str(v)[:40],
)
def test_retry_after_is_read_from_real_headers(
    sdk: Caller, headers: dict[str, str], expected: float | None
) -> None:
    e = sdk.error({"kind": "status", "status": 429, "headers": headers})
    o = classify_openai(e, now=NOW)
    assert o.kind is OutcomeKind.RATE_LIMITED
    if expected is None:
        assert o.retry_after is None
    else:
        assert o.retry_after == pytest.approx(expected, abs=1.0)


def test_retry_after_hint_in_the_body(sdk: Caller) -> None:
    body = _error({"message": "Rate limit reached. Please try again in 20s.", "type": "tokens"})
    o = classify_openai(sdk.error(status(429, body)))
    assert (o.kind, o.retry_after) == (OutcomeKind.RATE_LIMITED, 20.0)


def test_x_should_retry_true_makes_a_4xx_retryable(sdk: Caller) -> None:
    o = classify_openai(sdk.error(status(400, x_should_retry="true")))
    assert o.kind is OutcomeKind.OVERLOADED
    assert "x-should-retry: true" in o.detail


def test_x_should_retry_false_stops_retrying_a_rate_limit(sdk: Caller) -> None:
    o = classify_openai(sdk.error(status(429, x_should_retry="false")))
    assert o.kind is OutcomeKind.QUOTA  # not retried on this credential: rotate or fall back
    assert "x-should-retry: false" in o.detail


# -- local faults --------------------------------------------------------------------------------


def test_a_missing_env_var_is_auth_and_names_the_variable() -> None:
    o = classify_openai(MissingCredential("ZAI_KEY_MISSING", "fallback_1"))
    assert o.kind is OutcomeKind.AUTH
    assert "ZAI_KEY_MISSING" in o.detail and "fallback_1" in o.detail
    assert o.retry_after == 0.0  # spent for the turn, not benched across turns


def test_a_client_that_cannot_be_built_is_transport() -> None:
    o = classify_openai(ClientUnavailable("fallback_1", RuntimeError("no sockets left")))
    assert o.kind is OutcomeKind.TRANSPORT
    assert "fallback_1" in o.detail and "no sockets left" in o.detail


def test_an_unknown_exception_is_a_bad_request_naming_it() -> None:
    o = classify_openai(TypeError("create() got an unexpected keyword argument 'tempreture'"))
    assert o.kind is OutcomeKind.BAD_REQUEST
    assert "TypeError" in o.detail and "tempreture" in o.detail


# -- secrets ------------------------------------------------------------------------------------

ODD_KEY = "fgk_live_ABCDEFGH12345678QRST"  # no sk- prefix: only the request header knows it


@pytest.mark.parametrize(
    "message",
    [
        f"Incorrect API key provided: {ODD_KEY[:12]}****{ODD_KEY[-4:]}.",
        f"key {ODD_KEY} was revoked",
        f"key ending in ...{ODD_KEY[9:21]}... is not valid",
        "Incorrect API key provided: sk-proj-****abcd. You can find your API key at ...",
    ],
)
def test_a_401_never_leaks_the_key_into_the_detail(sdk: Caller, message: str) -> None:
    e = sdk.error(status(401, _error({"message": message})), key=ODD_KEY)
    o = classify_openai(e)
    assert o.kind is OutcomeKind.AUTH
    assert "***" in o.detail
    for n in range(0, len(ODD_KEY) - 8):
        assert ODD_KEY[n : n + 8] not in o.detail
    assert "abcd" not in o.detail


def test_scrub_keeps_ordinary_words() -> None:
    text = "The model glm-5.1 is overloaded, retry later"
    assert scrub(text, ["sk-secret-key-123456"]) == text
