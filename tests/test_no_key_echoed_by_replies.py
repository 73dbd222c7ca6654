"""No key comes back in a reply: a provider that echoes the key it was sent (in an error
body, in a stream's error event) reaches the caller with the key masked, through
`fallgate.http_client` (where the SDK builds its own exception from the reply, and agent
frameworks log it) and through the wrapper (`TurnFailed.last_error.response`).

Every echo style of `test_no_key_echoed` is replayed through the real SDK against the
fault server, on a one-key policy: the key echoed is the key the request carried."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import openai
import pytest
from fallgate.fsm import VirtualClock
from test_no_key_echoed import ECHO_STYLES, KEY, _leaks

import fallgate
from fallgate import Fallgate, TurnFailed

from helpers import chain

MESSAGES = [{"role": "user", "content": "hi"}]


def _body(style: str) -> dict[str, Any]:
    message = ECHO_STYLES[style]
    return {"error": {"message": message, "type": "invalid_request_error", "code": "bad_key"}}


def _texts(e: BaseException) -> dict[str, str]:
    """Everywhere an SDK error shows what the provider said."""
    response = getattr(e, "response", None)
    return {
        "str": str(e),
        "repr": repr(e),
        "traceback": "".join(traceback.format_exception(e)),
        "message": str(getattr(e, "message", "")),
        "body": repr(getattr(e, "body", "")),
        "response.text": response.text if response is not None else "",
    }


def _leaked(e: BaseException) -> dict[str, list[str]]:
    return {where: found for where, text in _texts(e).items() if (found := _leaks(text))}


@pytest.mark.parametrize("status", [401, 400])
@pytest.mark.parametrize("style", sorted(ECHO_STYLES))
def test_an_error_reply_through_http_client_reaches_the_sdk_without_the_key(
    fault_server, style, status
):
    fault_server.script({"default": {"kind": "status", "status": status, "body": _body(style)}})
    policy = chain({"model": "m0", "api_key": KEY}, server=fault_server)
    with openai.OpenAI(api_key="unused", http_client=fallgate.http_client(policy)) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="m0", messages=MESSAGES)
    assert caught.value.status_code == status  # the provider's status, as it sent it
    assert _leaked(caught.value) == {}
    assert "bad_key" in caught.value.response.text  # the rest of its body is kept


def test_an_error_reply_through_async_http_client_reaches_the_sdk_without_the_key(fault_server):
    fault_server.script(
        {"default": {"kind": "status", "status": 401, "body": _body("the whole key")}}
    )
    policy = chain({"model": "m0", "api_key": KEY}, server=fault_server)

    async def turn() -> BaseException:
        http = fallgate.async_http_client(policy)
        async with openai.AsyncOpenAI(api_key="unused", http_client=http) as client:
            try:
                await client.chat.completions.create(model="m0", messages=MESSAGES)
            except openai.APIStatusError as e:
                return e
        raise AssertionError("the turn answered")

    assert _leaked(asyncio.run(turn())) == {}


@pytest.mark.parametrize("style", sorted(ECHO_STYLES))
def test_a_stream_error_event_after_content_reaches_the_caller_without_the_key(
    fault_server, style
):
    error = _body(style)["error"]
    step = {"kind": "stream", "chunks": 2, "then": "error", "error": error}
    fault_server.script({"default": step})
    policy = chain({"model": "m0", "api_key": KEY}, server=fault_server)
    with openai.OpenAI(api_key="unused", http_client=fallgate.http_client(policy)) as client:
        with pytest.raises(openai.APIError) as caught:
            for _ in client.chat.completions.create(model="m0", messages=MESSAGES, stream=True):
                pass
    assert _leaked(caught.value) == {}


@pytest.mark.parametrize("style", sorted(ECHO_STYLES))
def test_the_wrappers_last_error_keeps_no_key_in_its_response(fault_server, style):
    fault_server.script({"default": {"kind": "status", "status": 401, "body": _body(style)}})
    policy = chain({"model": "m0", "api_key": KEY}, server=fault_server)
    with Fallgate(policy, clock=VirtualClock()) as client:
        with pytest.raises(TurnFailed) as caught:
            client.chat.completions.create(messages=MESSAGES)
    error = caught.value.last_error
    assert error is not None and getattr(error, "status_code", None) == 401
    assert _leaked(error) == {}
