"""The provider error catalogue (tests/data/error_catalogue.json), replayed for real.

Every entry is an error body a user met and pasted into a public issue (its URL is
in the entry). The fault server answers it with the entry's status, headers and
body; the real openai SDK raises what it raises; `classify_openai`, given the
entry's registry provider, must land it in the expected class. Then a few whole
turns show what the class changes: a billing 400 falls back, a day's quota benches
the key until midnight Pacific while a per-minute limit is waited out, a bad key
reported as 400 rotates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.fsm import OutcomeKind, instant_waits
from fallgate.fsm.catalogue.registry import PROVIDERS
from fallgate.providers import Fallgate
from fallgate.providers.openai.exceptions import classify_openai
from fallgate.providers.openai.http import transport
from fallgate.providers.openai.http.pools import shared_ssl_context
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain, key

CATALOGUE_PATH = Path(__file__).parent / "data" / "error_catalogue.json"
CATALOGUE: list[dict[str, Any]] = json.loads(CATALOGUE_PATH.read_text("utf-8"))["entries"]
BY_ID = {e["id"]: e for e in CATALOGUE}
MSG = [{"role": "user", "content": "hi"}]
KEY = "sk-catalogue-0123456789abcdef"

#: The providers the catalogue must cover (issue 14, finding 8).
REQUIRED = {
    "OpenAI",
    "Azure OpenAI",
    "Anthropic",
    "Z.AI",
    "Gemini",
    "OpenRouter",
    "Groq",
    "DeepSeek",
    "Mistral",
    "Together",
    "Fireworks",
    "vLLM",
    "Ollama",
    "llama.cpp",
}
FIELDS = {"id", "provider", "registry", "status", "body", "source", "expected", "why"}
OPTIONAL = {"headers", "content_type", "retry_after", "reset"}
#: A day's quota at Gemini comes back at midnight Pacific (its rate-limits page): at most a
#: day (and the hour a DST change adds) away.
DAY = 25 * 3600.0


def step(entry: dict[str, Any]) -> dict[str, Any]:
    """The fault-server step that answers exactly this entry."""
    s: dict[str, Any] = {"kind": "status", "status": entry["status"], "body": entry["body"]}
    if "headers" in entry:
        s["headers"] = entry["headers"]
    if "content_type" in entry:
        s["content_type"] = entry["content_type"]
    return s


@pytest.fixture(scope="module")
def sdk() -> Iterator[tuple[FaultServer, openai.OpenAI]]:
    """One fault server and one real SDK client (retries off) for the module."""
    with FaultServer() as srv:
        http = transport.DefaultClient(verify=shared_ssl_context())
        client = openai.OpenAI(
            base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=2.0, http_client=http
        )
        yield srv, client
        http.close()


# -- the catalogue itself ------------------------------------------------------------------------


def test_every_entry_is_complete_and_cites_its_source() -> None:
    """Each entry has the fields a reader needs (what, where it was met, what it should
    be and why); ids are unique; the expected class and registry name exist."""
    ids = [e["id"] for e in CATALOGUE]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for e in CATALOGUE:
        assert FIELDS <= e.keys() <= FIELDS | OPTIONAL, e["id"]
        assert e["source"].startswith("https://"), e["id"]
        assert OutcomeKind(e["expected"]) not in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED)
        assert e["registry"] is None or e["registry"] in PROVIDERS, e["id"]
        assert 400 <= e["status"] <= 599, e["id"]
        assert isinstance(e["body"], dict | list) or "content_type" in e, e["id"]
        assert len(e["why"]) > 10, e["id"]


def test_the_catalogue_covers_every_provider_and_the_hard_families() -> None:
    """Breadth: every provider of the list, billing errors outside 402 and 429,
    per-minute next to per-day limits, and a context overflow for each wording."""
    assert REQUIRED <= {e["provider"] for e in CATALOGUE}
    quota_statuses = {e["status"] for e in CATALOGUE if e["expected"] == "quota"}
    assert {400, 402, 403, 413, 429} <= quota_statuses
    overflow = [e for e in CATALOGUE if e["expected"] == "context_too_long"]
    assert len({e["provider"] for e in overflow}) >= 9
    kinds = {e["expected"] for e in CATALOGUE}
    assert {"quota", "rate_limited", "auth", "not_found", "context_too_long"} <= kinds
    assert {"overloaded", "content_filtered", "bad_request"} <= kinds


# -- replay: every entry through the real SDK ----------------------------------------------------


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e["id"] for e in CATALOGUE])
def test_catalogue_entry_lands_in_its_class(
    sdk: tuple[FaultServer, openai.OpenAI], entry: dict[str, Any]
) -> None:
    srv, client = sdk
    srv.script({"models": {"m": [step(entry)]}})
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="m", messages=MSG)
    assert caught.value.status_code == entry["status"]
    provider = PROVIDERS[entry["registry"]] if entry["registry"] else None
    o = classify_openai(caught.value, provider=provider)
    assert o.kind.value == entry["expected"], f"{entry['id']}: {o} ({entry['why']})"
    if "retry_after" in entry:
        assert o.retry_after == entry["retry_after"], o
    if o.kind is OutcomeKind.QUOTA and entry.get("reset") == "midnight_pacific":
        assert o.retry_after is not None and 0 < o.retry_after <= DAY, o
    elif o.kind is OutcomeKind.QUOTA:
        assert o.retry_after is None, "quota is benched for the cooldown cap, not a hint"
    assert KEY not in o.detail


# -- what the class changes, whole turns --------------------------------------------------------


@pytest.fixture
def srv() -> Iterator[FaultServer]:
    with FaultServer() as server, instant_waits():
        yield server


def test_a_billing_error_sent_as_400_falls_back(srv: FaultServer) -> None:
    """Anthropic's "credit balance is too low" is a 400: before, the turn failed with a
    healthy fallback configured; as quota it goes to the fallback after one request."""
    srv.script(
        {
            "models": {
                "claude": [step(BY_ID["anthropic-credit-balance-400"])],
                "glm": [{"kind": "answer", "text": "from the fallback"}],
            }
        }
    )
    policy = chain("claude", "glm", server=srv, max_attempts=2)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "from the fallback"
    assert srv.counts == {"claude": 1, "glm": 1}


def test_a_days_quota_benches_the_key_until_midnight_pacific() -> None:
    """Gemini's per-day quota id: the key is not retried and stays benched until the
    quota comes back, midnight Pacific (https://ai.google.dev/gemini-api/docs/rate-limits;
    it was benched for the cooldown cap, 300 s, before); the second key answers."""
    import datetime as dt
    import time
    from zoneinfo import ZoneInfo

    with FaultServer() as srv, instant_waits() as clock:
        srv.script({"models": {"gemini": [step(BY_ID["gemini-per-day-quota-429"])]}})
        policy = chain("gemini", server=srv, keys=2, max_attempts=3)
        with Fallgate(policy) as gate:
            result = gate.run(messages=MSG)
            t = policy.targets[0]
            first, second = t.pool()
            benched = gate.health.credential_until(t.key, first.health_id) - clock()
            assert gate.health.credential_until(t.key, second.health_id) == 0.0
        assert result.value.choices[0].message.content == "ok"
        assert [r.api_key for r in srv.requests] == [key(0, 0), key(0, 1)]
    pacific = dt.datetime.now(ZoneInfo("America/Los_Angeles"))
    midnight = (pacific + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert benched == pytest.approx(midnight.timestamp() - time.time(), abs=60.0)
    assert benched > policy.cooldown.cap or midnight.timestamp() - time.time() < 300


def test_a_per_minute_limit_is_waited_out_on_the_same_key(srv: FaultServer) -> None:
    """The same 429 RESOURCE_EXHAUSTED without a per-day quota id is a rate limit: the
    one key is retried after a wait, and answers."""
    srv.script({"models": {"gemini": [step(BY_ID["gemini-resource-exhausted-bare-429"])]}})
    policy = chain("gemini", server=srv, max_attempts=2)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "ok"
    assert srv.counts == {"gemini": 2}
    assert "rate_limited" in [e.event for e in result.trace]


def test_a_bad_key_reported_as_400_rotates_to_the_next_key(srv: FaultServer) -> None:
    """Gemini's 400 INVALID_ARGUMENT with reason API_KEY_INVALID is auth: the next key
    is tried (before, bad_request ended the turn)."""
    srv.script({"models": {"gemini": [step(BY_ID["gemini-invalid-key-400"])]}})
    policy = chain("gemini", server=srv, keys=2, max_attempts=2)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "ok"
    assert srv.counts == {"gemini": 2}
    assert len({r.api_key for r in srv.requests}) == 2


def test_a_context_overflow_in_llama_cpp_words_goes_to_the_larger_window(
    srv: FaultServer,
) -> None:
    """llama.cpp's exceed_context_size_error (even as a 500) is context_too_long: not
    retried, and the turn goes on to the fallback with the larger context_length."""
    srv.script(
        {
            "models": {
                "local": [step(BY_ID["llamacpp-exceed-context-500"])],
                "small": [{"kind": "answer", "text": "too small"}],
                "big": [{"kind": "answer", "text": "from the big window"}],
            }
        }
    )
    policy = chain("local@8192", "small@4096", "big@131072", server=srv, max_attempts=3)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "from the big window"
    assert srv.counts == {"local": 1, "big": 1}


def test_the_docs_state_the_catalogues_size():
    """docs/providers.md and docs/limits.md say how many bodies the catalogue holds: kept
    true."""
    docs = Path(__file__).parent.parent / "docs"
    n = len(CATALOGUE)
    assert f"holds {n} error bodies" in (docs / "providers.md").read_text("utf-8")
    limits = " ".join((docs / "limits.md").read_text("utf-8").split())
    assert f"against the {n} bodies of the catalogue" in limits
