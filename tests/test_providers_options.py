"""Per-call and per-wrapper options, over real HTTP: ``with_options``, every form of
``timeout=`` (combined with the engine's own limit), and ``model=``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import Target, TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http import transport
from fallgate.providers.openai.http.timeouts import Bound, combine
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
RATE_LIMITED = {"kind": "status", "status": 429, "headers": {"retry-after": "60"}}


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


# --------------------------------------------------------------------------- with_options


def test_with_options_shares_the_health_store_and_the_clients(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [RATE_LIMITED]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        tenant = gate.with_options(default_headers={"x-tenant": "t1"}, timeout=20)
        assert tenant.health is gate.health and tenant.clients is gate.clients
        assert tenant.with_options().policy is gate.policy
        assert tenant.chat.completions.create(messages=MSG).model == "b"  # a now cools 60 s
        result = gate.run(messages=MSG)  # the cooldown set through `tenant` is seen here
        assert (result.model, result.trace[0].dest) == ("b", "fallback_1")
        # ... and one set through `gate` is seen by `tenant`
        fault_server.script({"models": {"b": [RATE_LIMITED]}})
        gate.health.clear()
        with pytest.raises(TurnFailed, match="rate_limited"):
            gate.run(messages=MSG, model="b")  # b alone: its key is benched for 60 s
        with pytest.raises(TurnFailed, match="cooling"):
            tenant.run(messages=MSG, model="b")
        assert gate.clients.built == 2  # one client per target, for both wrappers


def test_with_options_applies_the_sdks_options_to_each_attempt(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        tagged = gate.with_options(default_headers={"x-tenant": "t1"}, organization="org-1")
        tagged = tagged.with_options(default_headers={"x-trace": "tr-9"}, project="proj-2")
        tagged.responses.create(input="hi")
        gate.responses.create(input="hi")
    a, b, plain = fault_server.requests
    for record in (a, b):  # both attempts of the turn, on both targets
        assert record.header("x-tenant") == "t1" and record.header("x-trace") == "tr-9"
        assert record.header("openai-organization") == "org-1"
        assert record.header("openai-project") == "proj-2"
    assert (a.model, b.model) == ("a", "b")
    assert plain.header("x-tenant") is None and plain.header("openai-project") is None


def test_with_options_timeout_bounds_every_attempt(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "timeout", "seconds": 5}]}})
    policy = chain("a", "b", server=fault_server, max_attempts=1, recover_transport=False)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        assert gate.with_options(timeout=0.2).chat.completions.create(messages=MSG).model == "b"
        assert time.monotonic() - t0 < 2.0
        assert gate.timeout is None and gate.with_options(timeout=0.2).timeout == 0.2


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_retries": 2}, ValueError, r"max_retries=2.*retries never multiply"),
        ({"api_key": "sk-x"}, ValueError, "keys come from the policy"),
        ({"base_url": "http://x"}, ValueError, "its own base_url"),
        ({"http_client": None}, ValueError, "client_factory"),
        (
            {"temperature": 1},
            TypeError,
            r"unexpected keyword argument 'temperature'.*default_headers",
        ),
        ({"timeout": -1}, ValueError, "timeout must be a positive number"),
    ],
)
def test_with_options_refuses_what_it_cannot_honour(
    fault_server: FaultServer, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    for cls in (Fallgate, AsyncFallgate):
        gate = cls(chain("a", server=fault_server))
        with pytest.raises(error, match=match):
            gate.with_options(**options)
    assert Fallgate(chain("a", server=fault_server)).with_options(max_retries=0) is not None


def test_async_with_options_shares_health(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [RATE_LIMITED]}})

    async def main() -> list[str]:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            other = gate.with_options(default_headers={"x-tenant": "t2"})
            first = await other.chat.completions.create(messages=MSG)
            second = await gate.arun(messages=MSG)
            return [first.model, second.trace[0].dest]

    assert asyncio.run(main()) == ["b", "fallback_1"]
    assert [r.header("x-tenant") for r in fault_server.requests] == ["t2", "t2", None]


# --------------------------------------------------------------------------- timeout=


def _recording(seen: list[dict[str, Any]]) -> Any:
    """A client factory whose HTTP client records each request's timeout."""

    def factory(target: Target, key: str) -> openai.OpenAI:
        hook = lambda request: seen.append(dict(request.extensions["timeout"]))  # noqa: E731
        http = transport.http.Client(event_hooks={"request": [hook]})
        return openai.OpenAI(base_url=target.base_url, api_key=key, max_retries=0, http_client=http)

    return factory


def _phases(connect: float, read: float, write: float, pool: float) -> dict[str, float]:
    return {"connect": connect, "read": read, "write": write, "pool": pool}


TIMEOUT_FORMS: list[tuple[str, Any, dict[str, float]]] = [
    ("number", 2, _phases(2, 2, 2, 2)),
    ("openai.Timeout", openai.Timeout(5, connect=1), _phases(1, 5, 5, 5)),
    # the engine's connect phase is the policy's connect_timeout (5 s)
    ("per phase, some unset", openai.Timeout(None, read=3), _phases(5, 3, 30, 30)),
    ("longer than the engine's", openai.Timeout(100), _phases(5, 30, 30, 30)),
    ("None", None, _phases(5, 30, 30, 30)),
    ("NOT_GIVEN", openai.NOT_GIVEN, _phases(5, 30, 30, 30)),
]


@pytest.mark.parametrize(
    ("form", "timeout", "sent"), TIMEOUT_FORMS, ids=[f[0] for f in TIMEOUT_FORMS]
)
def test_every_sdk_timeout_form_is_capped_by_the_engines_limit(
    fault_server: FaultServer, form: str, timeout: Any, sent: dict[str, float]
) -> None:
    seen: list[dict[str, Any]] = []
    policy = chain("a", server=fault_server, attempt_timeout=30)
    with Fallgate(policy, client_factory=_recording(seen)) as gate:
        gate.chat.completions.create(messages=MSG, timeout=timeout)
        gate.embeddings.create(input="x", timeout=timeout)
    assert seen == [sent, sent]


@pytest.mark.parametrize("library", ["httpx", "httpx2"])
def test_either_http_librarys_timeout_is_accepted(fault_server: FaultServer, library: str) -> None:
    lib = pytest.importorskip(library)
    seen: list[dict[str, Any]] = []
    with Fallgate(chain("a", server=fault_server), client_factory=_recording(seen)) as gate:
        gate.responses.create(input="x", timeout=lib.Timeout(4, pool=0.5))
    assert seen == [_phases(4, 4, 4, 0.5)]


def test_the_gates_timeout_the_calls_and_the_engines_all_bound_an_attempt(
    fault_server: FaultServer,
) -> None:
    seen: list[dict[str, Any]] = []
    policy = chain("a", server=fault_server, attempt_timeout=3)
    factory = _recording(seen)
    with Fallgate(policy, timeout=openai.Timeout(10, connect=1), client_factory=factory) as gate:
        gate.run(messages=MSG, timeout=openai.Timeout(5, read=2))
        gate.with_options(timeout=0.5).run(messages=MSG)
    assert seen == [_phases(1, 2, 3, 3), _phases(0.5, 0.5, 0.5, 0.5)]
    assert combine(3.0, Bound.parse(2), None) == 2.0
    assert isinstance(combine(3.0, Bound.parse(openai.Timeout(5, connect=1))), transport.Timeout)


def test_a_read_timeout_of_the_callers_really_ends_the_attempt(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "hang", "seconds": 5}]}})
    policy = chain("a", "b", server=fault_server, max_attempts=1, recover_transport=False)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        reply = gate.chat.completions.create(messages=MSG, timeout=openai.Timeout(30, read=0.2))
        assert time.monotonic() - t0 < 2.0 and reply.model == "b"


@pytest.mark.parametrize("bad", ["5", -1, 0, float("nan"), True, object(), openai.Timeout(-2)])
def test_a_bad_timeout_is_refused_before_any_request(fault_server: FaultServer, bad: Any) -> None:
    with Fallgate(chain("a", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="timeout must be a positive number"):
            gate.chat.completions.create(messages=MSG, timeout=bad)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        Fallgate(chain("a", server=fault_server), timeout=bad)
    assert fault_server.requests == []


# --------------------------------------------------------------------------- model=


def test_model_names_where_the_chain_starts(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"b": [{"kind": "status", "status": 503}] * 4}})
    policy = chain("a", "b", "c", server=fault_server, provider="p{i}")
    with Fallgate(policy) as gate:
        for model in ("b", "p1/b", "fallback_1"):
            gate.health.clear()
            result = gate.run(messages=MSG, model=model)
            # b first, then on down the chain; the primary is never tried
            assert (result.target, result.model) == ("fallback_2", "c")
            assert [e.dest for e in result.trace] == ["fallback_1", "fallback_2", "done"]
        assert gate.chat.completions.create(messages=MSG, model="a").model == "a"
        assert gate.chat.completions.create(messages=MSG, model=None).model == "a"
        assert gate.chat.completions.create(messages=MSG, model="c").model == "c"
        # the sub-chains share the gate's clients: one per target, never rebuilt for them
        assert gate.clients.built == 3
        assert gate.clients.stats()["live"] == [
            "fallback_1/key#1",
            "fallback_2/key#1",
            "primary/key#1",
        ]
    assert [r.model for r in fault_server.requests] == ["b", "c"] * 3 + ["a", "a", "c"]


def test_a_sub_chain_shares_the_health_store(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"b": [RATE_LIMITED]}})
    with Fallgate(chain("a", "b", "c", server=fault_server)) as gate:
        assert gate.run(messages=MSG, model="b").model == "c"  # b's key now cools 60 s
        assert gate.run(messages=MSG).model == "a"
        failed_over = gate.run(messages=MSG, model="b")
        assert failed_over.model == "c" and failed_over.trace[0].dest == "fallback_2"
    assert fault_server.counts == {"b": 1, "c": 2, "a": 1}


def test_model_works_on_every_surface_and_stream(fault_server: FaultServer) -> None:
    async def main(policy: Any) -> list[str]:
        async with AsyncFallgate(policy) as gate:
            stream = await gate.responses.create(input="hi", model="b", stream=True)
            events = [e async for e in stream]
            vectors = await gate.embeddings.create(input="x", model="fallback_1")
            return [events[-1].response.model, vectors.model]

    policy = chain("a", "b", server=fault_server)
    with Fallgate(policy) as gate:
        chunks = list(gate.chat.completions.create(messages=MSG, model="b", stream=True))
        assert {c.model for c in chunks} == {"b"}
    assert asyncio.run(main(policy)) == ["b", "b"]
    assert [r.model for r in fault_server.requests] == ["b", "b", "b"]


@pytest.mark.parametrize("model", ["gpt-4o", "", "fault/zzz", 7, "primary/a"])
def test_any_other_model_is_a_clear_error_listing_the_chain(
    fault_server: FaultServer, model: Any
) -> None:
    policy = chain("a", "b", server=fault_server)
    with Fallgate(policy) as gate:
        with pytest.raises(ValueError) as info:
            gate.chat.completions.create(messages=MSG, model=model)
        with pytest.raises(ValueError):
            gate.responses.create(input="hi", model=model, stream=True)
    message = str(info.value)
    assert f"model={model!r} is not in this gate's chain" in message
    assert "primary 'a' (fault/a), fallback_1 'b' (fault/b)" in message
    assert fault_server.requests == []
