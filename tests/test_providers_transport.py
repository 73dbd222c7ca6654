"""providers.openai.http.transport: the HTTP library under the installed openai SDK (httpx2 with
openai 3.x, httpx with 2.x), the clients the pools build on it, and its exceptions.

Runs under both SDKs (`make test` has openai 3.x, `make test-openai2` openai 2.x).
"""

from __future__ import annotations

import re
import socket
import ssl
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from fallgate.fsm import OutcomeKind, Target
from fallgate.providers.openai.exceptions import StreamInterrupted, classify_openai
from fallgate.providers.openai.http import transport
from fallgate.providers.openai.http.pools import async_openai_factory, openai_factory

ROOT = Path(__file__).resolve().parent.parent


def test_the_library_is_the_one_the_sdk_builds_its_own_clients_on() -> None:
    with openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9") as sdk_default:
        assert isinstance(sdk_default._client, transport.http.Client)
    assert transport.NAME == transport.http.__name__ in ("httpx", "httpx2")
    # Late 2.x releases also have openai.DefaultHttpx2Client (an experimental opt-in),
    # but build their own clients on httpx: so must we.
    with transport.DefaultClient() as http:
        assert isinstance(http, transport.http.Client)


def test_the_pools_clients_use_the_library_and_our_transport() -> None:
    target = Target("openai", "m", base_url="http://127.0.0.1:9")
    with openai_factory(5.0)(target, "sk-test") as client:
        http = client._client
        assert isinstance(http, transport.http.Client)
        assert http.timeout.read == 5.0
        pool = http._transport._pool  # the same in httpx 0.28 and httpx2
        assert pool._ssl_context is transport.shared_ssl_context()
        assert pool._socket_options == [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


async def test_the_async_pools_clients_use_the_library_and_our_transport() -> None:
    target = Target("openai", "m", base_url="http://127.0.0.1:9")
    async with async_openai_factory(5.0)(target, "sk-test") as client:
        http = client._client
        assert isinstance(http, transport.http.AsyncClient)
        pool = http._transport._pool
        assert pool._ssl_context is transport.shared_ssl_context()
        assert pool._socket_options == [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


@pytest.fixture
def fresh_ssl(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ssl.SSLContext]]:
    """Forget the shared SSL context; record every one built from now on."""
    built: list[ssl.SSLContext] = []
    make = transport._default_ssl_context

    def counting() -> ssl.SSLContext:
        built.append(make())
        return built[-1]

    monkeypatch.setattr(transport, "_ssl_context", None)
    monkeypatch.setattr(transport, "_default_ssl_context", counting)
    yield built


async def test_every_client_shares_one_verifying_ssl_context(
    fresh_ssl: list[ssl.SSLContext],
) -> None:
    targets = [Target("openai", m, base_url="http://127.0.0.1:9") for m in "abc"]
    for t in targets:
        openai_factory(5.0)(t, "sk-1").close()
        await async_openai_factory(5.0)(t, "sk-2").close()
    assert len(fresh_ssl) == 1
    ctx = fresh_ssl[0]
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname


def test_without_create_ssl_context_the_context_follows_httpxs_rules(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # httpx before 0.28 has no public create_ssl_context: we build what it would
    monkeypatch.setattr(transport, "http", types.SimpleNamespace(**{"__name__": transport.NAME}))
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    ctx = transport._default_ssl_context()
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    missing = tmp_path / "no-such-bundle.pem"
    monkeypatch.setenv("SSL_CERT_FILE", str(missing))
    with pytest.raises(FileNotFoundError):
        transport._default_ssl_context()


def test_the_transport_options_are_accepted_by_both_transport_classes() -> None:
    options = transport.transport_options()
    assert options["verify"] is transport.shared_ssl_context()
    assert options["socket_options"] == [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    transport.HTTPTransport(**options).close()
    transport.AsyncHTTPTransport(**options)


# -- exceptions ----------------------------------------------------------------------------


def test_the_librarys_timeouts_and_transport_errors_are_transport_outcomes() -> None:
    http = transport.http
    for e in (http.ReadTimeout("timed out"), http.ConnectTimeout("x"), http.PoolTimeout("x")):
        o = classify_openai(e)
        assert o.kind is OutcomeKind.TRANSPORT and o.detail.startswith("timeout ("), o
    for e in (
        http.RemoteProtocolError("peer closed connection without sending complete message"),
        http.ConnectError("refused"),
        http.ReadError("reset"),
        http.StreamClosed(),
    ):
        o = classify_openai(e)
        assert o.kind is OutcomeKind.TRANSPORT, o
        assert o.detail.startswith(f"connection error ({type(e).__name__}"), o


def test_a_stream_cut_by_the_librarys_own_error_is_an_interrupted_stream() -> None:
    # openai 2.x lets the library's error out of a stream's iteration (3.x wraps it)
    cut = transport.http.RemoteProtocolError("incomplete chunked read")
    o = classify_openai(StreamInterrupted("Hel", 1, cut))
    assert o.kind is OutcomeKind.STREAM_INTERRUPTED
    assert o.partial == "Hel" and "transport" in o.detail and "RemoteProtocolError" in o.detail


def test_the_other_library_counts_too_when_something_loaded_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = "httpx" if transport.NAME == "httpx2" else "httpx2"

    class TimeoutException(Exception):
        pass

    class TransportError(Exception):
        pass

    fake = types.ModuleType(other)
    fake.TimeoutException = TimeoutException  # type: ignore[attr-defined]
    fake.TransportError = TransportError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, other, fake)
    assert TimeoutException in transport.timeout_errors()
    assert TransportError in transport.transport_errors()
    assert classify_openai(TimeoutException("slow")).detail.startswith("timeout (")
    assert classify_openai(TransportError("gone")).kind is OutcomeKind.TRANSPORT


def test_only_the_transport_module_imports_an_http_library() -> None:
    pattern = re.compile(r"^\s*(import|from)\s+httpx2?\b", re.MULTILINE)
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("fsm", "providers", "tests")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p != ROOT / "providers" / "transport.py" and pattern.search(p.read_text())
    ]
    assert offenders == []
