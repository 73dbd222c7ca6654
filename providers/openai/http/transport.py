"""The HTTP library under the installed `openai` SDK, and what the pools need from it.

openai 3.x is built on ``httpx2``, openai 2.x on ``httpx`` (0.23-0.28). Which one is
found by asking openai itself: the library is the package whose ``Client`` the SDK's
own default client class (`openai.DefaultHttpxClient`, in both major versions)
derives from. (Not "does openai have `DefaultHttpx2Client`": late 2.x releases have it
as an experimental opt-in, yet build their own clients on httpx.) Nothing else in
fallgate imports ``httpx``/``httpx2``: the pools and the classifier go through this
module, and neither library is a declared dependency (openai brings the one it uses).

API:

- `NAME`, `http`: the library's name (``"httpx2"`` or ``"httpx"``) and module.
- `DefaultClient`, `DefaultAsyncClient`: the SDK's factories for an HTTP client with
  its own defaults (`openai.DefaultHttpx2Client` on 3.x, `openai.DefaultHttpxClient`
  on 2.x, and their async twins).
- `HTTPTransport`, `AsyncHTTPTransport`, `Limits`, `Timeout`: the library's classes;
  `LIMITS` and `SOCKET_OPTIONS` the pool limits and socket options we use.
- `shared_ssl_context()`: one verifying SSL context for every client we build.
- `transport_options()`: keyword arguments for `HTTPTransport`/`AsyncHTTPTransport`
  (the shared SSL context, the pool limits, TCP_NODELAY where the library takes
  socket options).
- `sync_http_client(timeout)`, `async_http_client(timeout)`: the SDK's default client
  over such a transport, with ``follow_redirects=False`` (a 3xx is the attempt's fault).
- `timeout_errors()`, `transport_errors()`: the HTTP libraries' timeout and
  transport/stream exception families, for classification.
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import openai

__all__ = [
    "LIMITS",
    "NAME",
    "SOCKET_OPTIONS",
    "AsyncHTTPTransport",
    "DefaultAsyncClient",
    "DefaultClient",
    "HTTPTransport",
    "Limits",
    "Timeout",
    "async_http_client",
    "http",
    "shared_ssl_context",
    "sync_http_client",
    "timeout_errors",
    "transport_errors",
    "transport_options",
]

# The HTTP libraries the openai SDK has been built on, and its client factories for each.
_FACTORIES = {
    "httpx2": ("DefaultHttpx2Client", "DefaultAsyncHttpx2Client"),  # openai >= 3
    "httpx": ("DefaultHttpxClient", "DefaultAsyncHttpxClient"),  # openai 2.x
}


def _find_library() -> ModuleType:
    """The HTTP library the installed openai builds its clients on."""
    for base in inspect.getmro(openai.DefaultHttpxClient):
        package = base.__module__.partition(".")[0]
        if package in _FACTORIES:
            return sys.modules[package]
    raise ImportError(
        f"fallgate: openai {openai.__version__} builds its HTTP clients on none of "
        f"{', '.join(_FACTORIES)}; fallgate supports openai 2.x (httpx) and 3.x (httpx2)"
    )


# Module handles are `Any`: mypy checks this file with only one of the libraries installed.
http: Any = _find_library()
NAME: str = http.__name__

DefaultClient: Callable[..., Any] = getattr(openai, _FACTORIES[NAME][0])
DefaultAsyncClient: Callable[..., Any] = getattr(openai, _FACTORIES[NAME][1])
HTTPTransport: Callable[..., Any] = http.HTTPTransport
AsyncHTTPTransport: Callable[..., Any] = http.AsyncHTTPTransport
Limits: Callable[..., Any] = http.Limits
Timeout: Callable[..., Any] = http.Timeout  # what the SDK's per-request ``timeout=`` takes


# -- TLS -----------------------------------------------------------------------------------

_ssl_lock = threading.Lock()
_ssl_context: ssl.SSLContext | None = None


def _default_ssl_context() -> ssl.SSLContext:
    """What the library builds for ``verify=True``: its own `create_ssl_context` (httpx2,
    httpx 0.28), else httpx's rule for older httpx: SSL_CERT_FILE / SSL_CERT_DIR, then
    certifi's CA bundle (an httpx dependency), then the system store."""
    create = getattr(http, "create_ssl_context", None)
    if create is not None:
        ctx: ssl.SSLContext = create()
        return ctx
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    try:
        certifi: Any = importlib.import_module("certifi")
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def shared_ssl_context() -> ssl.SSLContext:
    """One verifying SSL context for every client we build.

    Loading the CA store costs ~50 ms per SDK client; sharing the (thread-safe)
    context makes per-(target, credential) clients and transport recovery cheap.
    """
    global _ssl_context
    if _ssl_context is None:
        with _ssl_lock:
            if _ssl_context is None:
                _ssl_context = _default_ssl_context()
    return _ssl_context


# -- transports ----------------------------------------------------------------------------

# The SDK's own pool limits; TCP_NODELAY because a request is written as head + body
# and Nagle's algorithm would hold the body for the peer's delayed ACK (~40 ms).
LIMITS: Any = http.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=5.0)
SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
# httpx before 0.24.1 has no `socket_options`: those transports go without TCP_NODELAY.
_TAKES_SOCKET_OPTIONS = "socket_options" in inspect.signature(http.HTTPTransport).parameters


def transport_options() -> dict[str, Any]:
    """Keyword arguments for `HTTPTransport` / `AsyncHTTPTransport`."""
    options: dict[str, Any] = {"verify": shared_ssl_context(), "limits": LIMITS}
    if _TAKES_SOCKET_OPTIONS:
        options["socket_options"] = SOCKET_OPTIONS
    return options


def sync_http_client(timeout: float, kind: Callable[..., Any] | None = None) -> Any:
    """The SDK's default sync HTTP client over our transport (`kind`, default the
    library's `HTTPTransport`), following no redirect (the SDK's default follows them:
    docs/design.md, "Redirects are not followed")."""
    make = kind or HTTPTransport
    return DefaultClient(
        timeout=timeout, follow_redirects=False, transport=make(**transport_options())
    )


def async_http_client(timeout: float, kind: Callable[..., Any] | None = None) -> Any:
    """The SDK's default async HTTP client over our transport, following no redirect."""
    make = kind or AsyncHTTPTransport
    return DefaultAsyncClient(
        timeout=timeout, follow_redirects=False, transport=make(**transport_options())
    )


# -- exception families --------------------------------------------------------------------


def _loaded() -> list[Any]:
    """The library openai uses, plus the other one when something loaded it (openai 3.x
    also accepts a legacy ``httpx`` client as ``http_client``)."""
    libs: list[Any] = [http]
    libs += [m for name in _FACTORIES if name != NAME and (m := sys.modules.get(name)) is not None]
    return libs


def timeout_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' timeouts (connect, read, write, pool)."""
    return tuple(lib.TimeoutException for lib in _loaded() if hasattr(lib, "TimeoutException"))


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP libraries' transport failures (`TransportError`: connection, protocol and
    proxy errors, `RemoteProtocolError` among them) and stream misuse (`StreamError`)."""
    return tuple(
        getattr(lib, name)
        for lib in _loaded()
        for name in ("TransportError", "StreamError")
        if hasattr(lib, name)
    )
