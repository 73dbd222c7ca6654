"""What a broken stream's continuation may carry: real SDK, loopback fault server.

A text prefix continues text only. A stream that handed content parts (a list
``content``, as Mistral's reasoning models stream), or whose request asked for several
choices, is not continued: the turn fails with exactly the text delivered. A Responses
stream whose text was closed (``output_text.done``, ``content_part.done``) is not
continued either: nothing may follow a closed part. A Responses continuation that goes
on after the message with a function call hands that call as the stream's next item;
one that answers with a call instead of the rest of the text is no continuation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import OUTPUT_TEXT, chain, response_body, response_message, sdk_cut_errors

CAN = {"assistant_prefix": True}
MSG = [{"role": "user", "content": "tell me"}]
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture(autouse=True)
def instant() -> Iterator[None]:
    with instant_waits():
        yield


def _broken_then(server: FaultServer, broken: list[Any], then: dict[str, Any]) -> None:
    """Target ``a`` streams `broken` and is cut; its next attempt (the continuation) is
    `then`."""
    server.script({"models": {"a": [{"kind": "sse", "events": broken, "done": False}, then]}})


def chunk(delta: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "a",
        "choices": [{"index": index, "delta": delta, "finish_reason": None}],
    }


def _collect(stream: Any) -> dict[int, str]:
    """The text of each choice the caller was handed (content parts' text included)."""
    got: dict[int, str] = {}
    for c in stream:
        for ch in c.choices:
            d = ch.delta.content
            text = d if isinstance(d, str) else "".join(p.get("text", "") for p in d or [])
            got[ch.index] = got.get(ch.index, "") + text
    return got


def test_a_stream_of_content_parts_is_never_replayed_when_it_breaks(
    fault_server: FaultServer,
) -> None:
    """Deltas whose ``content`` is a list of parts (a thinking part, then text parts),
    then a cut: the text delivered is counted, and the stream is not continued (an empty
    prefix would ask the question again and hand the whole answer a second time)."""
    broken = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]}]}),
        chunk({"content": [{"type": "text", "text": "The answer "}]}),
        chunk({"content": [{"type": "text", "text": "is 4"}]}),
    ]
    _broken_then(fault_server, broken, {"kind": "continue", "text": "The answer is 42."})
    got: dict[int, str] = {}
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as e:
            got = _collect(gate.chat.completions.create(messages=MSG, stream=True))
    assert e.value.partial == "The answer is 4"
    assert fault_server.count("a") == 1  # no continuation sent
    assert got == {}  # raised mid-iteration: what was handed is `partial`


def test_a_stream_that_asked_for_two_choices_is_not_continued_before_the_second_spoke(
    fault_server: FaultServer,
) -> None:
    """``n = 2``; choice 0 says "Hello wor" and the stream is cut before choice 1 said
    anything: a continuation would hand choice 1 a tail of choice 0's text. The turn fails
    with what was delivered."""
    broken = [chunk({"role": "assistant", "content": "Hello "}), chunk({"content": "wor"})]
    _broken_then(fault_server, broken, {"kind": "continue", "text": "Hello world!"})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as e:
            _collect(gate.chat.completions.create(messages=MSG, stream=True, n=2))
    assert e.value.partial == "Hello wor"
    assert "several choices" in str(e.value)
    assert fault_server.count("a") == 1


def _ev(kind: str, seq: int, **kw: Any) -> dict[str, Any]:
    return {"type": kind, "sequence_number": seq, **kw}


def _opened(rid: str, mid: str, pieces: list[str]) -> list[dict[str, Any]]:
    at = {"output_index": 0, "item_id": mid, "content_index": 0}
    ev = [
        _ev("response.created", 0, response=response_body("in_progress", [], rid)),
        _ev(
            "response.output_item.added",
            1,
            output_index=0,
            item=response_message(None, "in_progress", mid),
        ),
        _ev("response.content_part.added", 2, part=OUTPUT_TEXT, **at),
    ]
    ev += [
        _ev("response.output_text.delta", 3 + i, delta=p, logprobs=[], **at)
        for i, p in enumerate(pieces)
    ]
    return ev


FC = {
    "type": "function_call",
    "id": "fc_B",
    "call_id": "call_B",
    "name": "get_weather",
    "arguments": "",
    "status": "in_progress",
}
FC_DONE = {**FC, "arguments": '{"city":"Paris"}', "status": "completed"}


def _call_events(index: int, seq: int) -> list[dict[str, Any]]:
    at = {"output_index": index, "item_id": "fc_B"}
    return [
        _ev("response.output_item.added", seq, output_index=index, item=FC),
        _ev("response.function_call_arguments.delta", seq + 1, delta='{"city":"Paris"}', **at),
        _ev("response.function_call_arguments.done", seq + 2, arguments='{"city":"Paris"}', **at),
        _ev("response.output_item.done", seq + 3, output_index=index, item=FC_DONE),
    ]


def test_a_function_call_after_the_continued_text_reaches_the_caller(
    fault_server: FaultServer,
) -> None:
    """The primary says "Let me check the weather" and is cut; its continuation finishes
    the message and then calls get_weather: the call is handed as the stream's next item
    (announced, its arguments streamed) and is in the final response after the whole
    message."""
    broken = _opened("resp_A", "msg_A", ["Let me check ", "the weather"])
    done_msg = response_message(" in Paris.", "completed", "msg_B")
    at = {"output_index": 0, "item_id": "msg_B", "content_index": 0}
    cont = _opened("resp_B", "msg_B", [" in Paris."])
    cont += [
        _ev("response.output_text.done", 4, text=" in Paris.", logprobs=[], **at),
        _ev("response.content_part.done", 5, part={**OUTPUT_TEXT, "text": " in Paris."}, **at),
        _ev("response.output_item.done", 6, output_index=0, item=done_msg),
    ]
    cont += _call_events(1, 7)
    cont.append(
        _ev(
            "response.completed",
            11,
            response=response_body("completed", [done_msg, FC_DONE], "resp_B"),
        )
    )
    _broken_then(fault_server, broken, {"kind": "sse", "events": cont})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with gate.responses.stream(input="weather?", tools=TOOLS) as stream:  # type: ignore[arg-type]
            events = list(stream)
            final = stream.get_final_response()
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output_text == "Let me check the weather in Paris."
    assert final.output[1].arguments == '{"city":"Paris"}'  # type: ignore[union-attr]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.item.type, e.output_index) for e in added] == [("message", 0), ("function_call", 1)]


def test_a_continuation_that_answers_with_a_call_instead_of_the_text_is_no_continuation(
    fault_server: FaultServer,
) -> None:
    """The continuation of "Let me check the weather" answers only with a function call:
    it does not go on with the text, so it is not handed (a final response holding only
    the call would drop the delivered text); no target can continue, and the turn fails
    with exactly the text delivered."""
    broken = _opened("resp_A", "msg_A", ["Let me check ", "the weather"])
    cont = [_ev("response.created", 0, response=response_body("in_progress", [], "resp_B"))]
    cont += _call_events(0, 1)
    cont.append(
        _ev("response.completed", 5, response=response_body("completed", [FC_DONE], "resp_B"))
    )
    _broken_then(fault_server, broken, {"kind": "sse", "events": cont})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server, max_attempts=2)) as gate:
        with pytest.raises(TurnFailed) as e:
            with gate.responses.stream(input="weather?", tools=TOOLS) as stream:  # type: ignore[arg-type]
                list(stream)
    assert e.value.partial == "Let me check the weather"
    assert "not the rest of the text" in str(e.value)


def test_a_responses_stream_cut_after_its_text_part_closed_is_not_continued(
    fault_server: FaultServer,
) -> None:
    """``output_text.done`` and ``content_part.done`` came, then a cut before the item's
    done: the text was closed, so a continuation would hand text (and a second ``done``)
    for a part the caller had closed."""
    ev = _opened("resp_A", "msg_A", ["Done."])
    at = {"output_index": 0, "item_id": "msg_A", "content_index": 0}
    ev += [
        _ev("response.output_text.done", 4, text="Done.", logprobs=[], **at),
        _ev("response.content_part.done", 5, part={**OUTPUT_TEXT, "text": "Done."}, **at),
    ]
    _broken_then(fault_server, ev, {"kind": "continue", "text": "Done. And more."})
    kinds: list[str] = []
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as e:
            for event in gate.responses.create(input="x", stream=True):
                kinds.append(event.type)
    assert kinds.count("response.output_text.done") == 1
    assert e.value.partial == "Done."
    assert fault_server.count("a") == 1


def _lp_chunk(content: str | None, tokens: list[str], finish: str | None = None) -> dict[str, Any]:
    lp = [
        {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens
    ]
    out = chunk({} if content is None else {"content": content})
    out["choices"][0].update(
        finish_reason=finish, logprobs={"content": lp, "refusal": None} if tokens else None
    )
    return out


def test_the_repeat_trimmed_at_a_seam_takes_its_tokens_logprobs_with_it(
    fault_server: FaultServer,
) -> None:
    """The continuation starts by repeating "brown fox " (10 characters, trimmed at the
    seam): the logprobs the caller gets spell exactly the text it got, never tokens it
    was not handed."""
    broken = [
        _lp_chunk("The ", ["The", " "]),
        _lp_chunk("quick ", ["quick", " "]),
        _lp_chunk("brown fox ", ["brown", " fox", " "]),
    ]
    cont = [
        _lp_chunk("brown fox jumps.", ["brown", " fox", " ", "jumps", "."]),
        _lp_chunk(None, [], "stop"),
    ]
    _broken_then(fault_server, broken, {"kind": "sse", "events": cont})
    text, tokens = "", []
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        stream = gate.chat.completions.create(messages=MSG, logprobs=True, stream=True)
        for c in stream:
            for ch in c.choices:
                text += ch.delta.content or ""
                tokens += [t.token for t in (ch.logprobs.content or [])] if ch.logprobs else []
    assert stream.seams == ((20, 10),)
    assert text == "The quick brown fox jumps." == "".join(tokens)


def test_a_reasoning_items_closed_part_does_not_close_the_message(
    fault_server: FaultServer,
) -> None:
    """A reasoning item with a ``reasoning_text`` content part (gpt-oss-style models)
    closes that part before the message starts; a cut mid-message is still continued:
    only the message's own part closes the text."""
    words = [f"w{i} " for i in range(10)]
    rs_at = {"output_index": 0, "content_index": 0, "item_id": "rs_1"}
    rpart = {"type": "reasoning_text", "text": ""}
    rs = {"type": "reasoning", "id": "rs_1", "summary": []}
    at = {"output_index": 1, "content_index": 0, "item_id": "msg_1"}
    ev = [
        _ev("response.created", 0, response=response_body("in_progress", [])),
        _ev("response.output_item.added", 1, output_index=0, item=rs),
        _ev("response.content_part.added", 2, part=rpart, **rs_at),
        _ev("response.reasoning_text.delta", 3, delta="hm", **rs_at),
        _ev("response.reasoning_text.done", 4, text="hm", **rs_at),
        _ev("response.content_part.done", 5, part={**rpart, "text": "hm"}, **rs_at),
        _ev(
            "response.output_item.done",
            6,
            output_index=0,
            item={**rs, "content": [{**rpart, "text": "hm"}]},
        ),
        _ev(
            "response.output_item.added",
            7,
            output_index=1,
            item=response_message(None, "in_progress"),
        ),
        _ev("response.content_part.added", 8, part=OUTPUT_TEXT, **at),
    ]
    ev += [
        _ev("response.output_text.delta", 9 + i, delta=w, logprobs=[], **at)
        for i, w in enumerate(words[:4])
    ]
    _broken_then(fault_server, ev, {"kind": "continue", "text": "".join(words)})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with gate.responses.stream(input="x") as stream:
            list(stream)
            final = stream.get_final_response()
    assert final.output_text == "".join(words)
    assert fault_server.count("a") == 2


def test_the_repeat_trimmed_at_a_responses_seam_takes_its_logprobs_with_it(
    fault_server: FaultServer,
) -> None:
    def lp(tokens: list[str]) -> list[dict[str, Any]]:
        return [
            {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
            for t in tokens
        ]

    broken = _opened("resp_A", "msg_A", [])
    at = {"output_index": 0, "item_id": "msg_A", "content_index": 0}
    broken += [
        _ev(
            "response.output_text.delta",
            3,
            delta="The quick ",
            logprobs=lp(["The", " quick", " "]),
            **at,
        ),
        _ev(
            "response.output_text.delta",
            4,
            delta="brown fox ",
            logprobs=lp(["brown", " fox", " "]),
            **at,
        ),
    ]
    cont = _opened("resp_B", "msg_B", [])
    bt = {"output_index": 0, "item_id": "msg_B", "content_index": 0}
    cont += [
        _ev(
            "response.output_text.delta",
            3,
            delta="brown fox jumps.",
            logprobs=lp(["brown", " fox", " ", "jumps", "."]),
            **bt,
        )
    ]
    done = response_message("brown fox jumps.", "completed", "msg_B")
    cont.append(_ev("response.completed", 4, response=response_body("completed", [done], "resp_B")))
    _broken_then(fault_server, broken, {"kind": "sse", "events": cont})
    text, tokens = "", []
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        for e in gate.responses.create(input="x", stream=True):
            if e.type == "response.output_text.delta":
                text += e.delta
                tokens += [t.token for t in e.logprobs or []]
    assert text == "The quick brown fox jumps." == "".join(tokens)


@pytest.mark.parametrize("via", ["wrapper", "http_client"])
def test_two_choices_asked_and_one_finished_before_a_cut_is_no_whole_answer(
    fault_server: FaultServer, via: str
) -> None:
    """``n = 2``: choice 0 speaks and finishes, then the connection is cut before choice 1
    said anything: the caller asked for two, so the answer did not end (the wrapper's turn
    fails with what was delivered; under http_client the SDK raises its cut)."""
    ev = [
        chunk({"role": "assistant", "content": "one"}),
        {**chunk({}), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev, "done": False}]}})
    policy = chain({"model": "a"}, server=fault_server)
    if via == "wrapper":
        with Fallgate(policy) as gate, pytest.raises(TurnFailed) as e:
            list(gate.chat.completions.create(messages=MSG, n=2, stream=True))
        assert e.value.partial == "one"
    else:
        import openai

        from fallgate import http_client

        with openai.OpenAI(api_key="unused", http_client=http_client(policy), max_retries=0) as c:
            with pytest.raises(sdk_cut_errors()):
                list(c.chat.completions.create(model="a", messages=MSG, n=2, stream=True))


def test_a_continuation_of_content_parts_has_its_repeat_trimmed_at_the_seam(
    fault_server: FaultServer,
) -> None:
    """The primary streams text and is cut; the continuation streams its text as content
    parts and starts by repeating the delivered end: the repeat is trimmed from the parts
    too, and the caller reads the answer once."""
    broken = [
        chunk({"role": "assistant", "content": "Hello "}),
        chunk({"content": "wonderful wor"}),
    ]
    parts = [
        chunk({"content": [{"type": "text", "text": "wonderful world!"}]}),
        {**chunk({}), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    _broken_then(fault_server, broken, {"kind": "sse", "events": parts})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        got = _collect(stream)
    assert stream.seams == ((19, 13),)
    assert got == {0: "Hello wonderful world!"}
