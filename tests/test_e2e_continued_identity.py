"""A continued stream is one stream to its caller: real SDK, loopback fault server.

After a break, the continuation's events carry the identity of the stream they
continue: chat chunks keep the first completion's id and send no second role opener;
Responses events keep the response's id, the message item's id and index, and the
sequence numbers going on, with no second ``response.created`` or item opener; and
the events that close the answer carry the whole text delivered, so the SDK's own
stream helpers (which refuse a changed identity) and a caller that reads the final
response get the whole answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.fsm import instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import OUTPUT_TEXT, chain, response_body, response_message

WORDS = [f"w{i} " for i in range(10)]
FULL = "".join(WORDS)
CAN = {"assistant_prefix": True}
MSG = [{"role": "user", "content": "tell me"}]
FLAVOURS = pytest.mark.parametrize("flavour", ["sync", "async"])


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def _cut_then_continued(srv: FaultServer, on: str = "a", **continuation: Any) -> None:
    """Model a streams 4 words and is cut; `on` continues with the whole answer (when
    that is another model, a refuses the prefix: the fallback continues)."""
    steps: dict[str, list[dict[str, Any]]] = {
        "a": [{"kind": "stream", "chunks": WORDS[:4], "then": "cut"}]
    }
    if on != "a":
        steps["a"].append({"kind": "refuse_prefix"})
    steps.setdefault(on, []).append({"kind": "continue", "text": FULL, **continuation})
    srv.script({"models": steps})


def _responses_events(policy: Any, flavour: str) -> list[Any]:
    if flavour == "sync":
        with Fallgate(policy) as gate:
            return list(gate.responses.create(input="tell me", stream=True))

    async def main() -> list[Any]:
        async with AsyncFallgate(policy) as gate:
            return [e async for e in await gate.responses.create(input="tell me", stream=True)]

    return asyncio.run(main())


def _one_stream(events: list[Any]) -> None:
    """The properties of one Responses stream, whole text included."""
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1 and kinds[0] == "response.created", kinds
    assert kinds.count("response.output_item.added") == 1, kinds
    assert kinds.count("response.content_part.added") == 1, kinds
    assert {e.response.id for e in events if getattr(e, "response", None) is not None} == {
        events[0].response.id
    }
    assert len({e.item_id for e in events if getattr(e, "item_id", None)}) == 1
    assert {e.output_index for e in events if hasattr(e, "output_index")} == {0}
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == FULL
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == FULL
    (item,) = [e for e in events if e.type == "response.output_item.done"]
    assert item.item.content[0].text == FULL and item.item.id == events[2].item.id
    assert kinds[-1] == "response.completed" and events[-1].response.output_text == FULL


@FLAVOURS
@pytest.mark.parametrize("on", ["a", "b"], ids=["same target", "fallback"])
def test_a_continued_responses_stream_keeps_its_ids_sequence_and_whole_text(
    fault_server: FaultServer, flavour: str, on: str
) -> None:
    _cut_then_continued(fault_server, on)
    policy = chain({"model": "a", **CAN}, {"model": "b", **CAN}, server=fault_server)
    events = _responses_events(policy, flavour)
    _one_stream(events)
    assert fault_server.counts == ({"a": 2} if on == "a" else {"a": 2, "b": 1})


def test_a_continuation_trimmed_at_the_seam_still_closes_with_the_whole_text(
    fault_server: FaultServer,
) -> None:
    """Its first 8 characters repeat the delivered end (held at the seam, then dropped):
    the closing events say the delivered text, not the continuation's own."""
    _cut_then_continued(fault_server, echo=8)
    policy = chain({"model": "a", **CAN}, server=fault_server)
    _one_stream(_responses_events(policy, "sync"))


def test_the_sdks_responses_stream_helper_gets_the_whole_answer_across_a_break(
    fault_server: FaultServer,
) -> None:
    _cut_then_continued(fault_server)
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with gate.responses.stream(input="tell me") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == FULL and final.output_text == FULL
    assert fault_server.counts == {"a": 2}


@FLAVOURS
def test_a_continued_chat_stream_keeps_its_id_and_opens_once(
    fault_server: FaultServer, flavour: str
) -> None:
    _cut_then_continued(fault_server, "b")
    policy = chain({"model": "a", **CAN}, {"model": "b", **CAN}, server=fault_server)
    if flavour == "sync":
        with Fallgate(policy) as gate:
            chunks = list(gate.chat.completions.create(messages=MSG, stream=True))
    else:

        async def main() -> list[Any]:
            async with AsyncFallgate(policy) as gate:
                s = await gate.chat.completions.create(messages=MSG, stream=True)
                return [c async for c in s]

        chunks = asyncio.run(main())
    assert len({c.id for c in chunks}) == 1
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == FULL


def test_a_continuation_that_reasons_first_is_still_one_message_to_the_caller(
    fault_server: FaultServer,
) -> None:
    """A reasoning model's continuation opens a reasoning item (index 0) before its
    message (index 1): only the message's events go on, under the continued message's
    index and id; the SDK's helper gets the whole answer, and the final response holds the
    message only."""
    rest = "".join(WORDS[4:])
    rs = {"type": "reasoning", "id": "rs_2", "summary": []}
    part = OUTPUT_TEXT

    def msg(text: str | None, status: str) -> dict[str, Any]:
        return response_message(text, status, "msg_2")

    def resp(status: str, output: list[Any]) -> dict[str, Any]:
        return response_body(status, output, "resp_2")

    at = {"output_index": 1, "content_index": 0, "item_id": "msg_2"}
    events = [
        {"type": "response.created", "response": resp("in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": rs},
        {"type": "response.output_item.done", "output_index": 0, "item": rs},
        {"type": "response.output_item.added", "output_index": 1, "item": msg(None, "in_progress")},
        {"type": "response.content_part.added", **at, "part": part},
        {"type": "response.output_text.delta", **at, "delta": rest, "logprobs": []},
        {"type": "response.output_text.done", **at, "text": rest, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": {**part, "text": rest}},
        {"type": "response.output_item.done", "output_index": 1, "item": msg(rest, "completed")},
        {"type": "response.completed", "response": resp("completed", [rs, msg(rest, "completed")])},
    ]  # fmt: skip
    for i, e in enumerate(events):
        e["sequence_number"] = i
    cut = {"kind": "stream", "chunks": WORDS[:4], "then": "cut"}
    fault_server.script({"models": {"a": [cut, {"kind": "sse", "events": events}]}})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with gate.responses.stream(input="tell me") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == FULL and final.output_text == FULL
    assert [o.type for o in final.output] == ["message"]
