"""No redirect is followed: a 3xx is the attempt's fault, with a reason naming it.

On main the SDK's HTTP client followed redirects: a 301/302/303 to another host
turned the POST into a GET whose answer came back as the primary's success, a 307/308
sent the prompt (and the key) to the other host, and a redirect loop cost 63 requests
in one turn. Real SDK, real sockets: two fault servers on loopback (two origins).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


@pytest.fixture
def elsewhere() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


def _redirect(status: int, location: str) -> dict[str, object]:
    return {"kind": "status", "status": status, "headers": {"Location": location}}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_not_followed(
    fault_server: FaultServer, elsewhere: FaultServer, status: int
) -> None:
    fault_server.script(
        {"default": _redirect(status, f"{elsewhere.base_url}/chat/completions?key=sk-leak1234")}
    )
    policy = chain("a", server=fault_server, max_attempts=2)
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
        gate.run(messages=MSG)
    assert elsewhere.requests == []  # neither the prompt nor a GET went there
    assert fault_server.count("a") == 1  # not_found: one request, no retry of a redirect
    reason = info.value.reasons["primary"]
    assert f"HTTP {status} redirect to {elsewhere.url}" in reason, reason
    assert "not followed" in reason and "sk-leak1234" not in reason


def test_a_same_origin_redirect_is_not_followed_either(fault_server: FaultServer) -> None:
    fault_server.script({"default": _redirect(307, f"{fault_server.base_url}/chat/completions")})
    policy = chain("a", server=fault_server, max_attempts=1)
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
        gate.run(messages=MSG)
    assert fault_server.count("a") == 1  # a redirect loop costs one request, not 20
    assert "HTTP 307 redirect to" in info.value.reasons["primary"]


def test_a_redirecting_primary_falls_back(
    fault_server: FaultServer, elsewhere: FaultServer
) -> None:
    fault_server.script(
        {"models": {"a": [_redirect(302, f"{elsewhere.url}/login")]}, "default": {"kind": "answer"}}
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    with Fallgate(policy) as gate:
        reply = gate.run(messages=MSG).value
    assert reply.choices[0].message.content == "ok"
    assert elsewhere.requests == []


async def test_the_async_client_follows_no_redirect_either(
    fault_server: FaultServer, elsewhere: FaultServer
) -> None:
    fault_server.script({"default": _redirect(308, f"{elsewhere.base_url}/chat/completions")})
    policy = chain("a", server=fault_server, max_attempts=1)
    async with AsyncFallgate(policy) as gate:
        with pytest.raises(TurnFailed):
            await gate.arun(messages=MSG)
    assert elsewhere.requests == [] and fault_server.count("a") == 1
