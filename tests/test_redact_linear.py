"""Scrubbing costs time linear in the text, and a text has a bounded size.

A 500 whose body held 32,000 ``x`` blocked an event loop for 19 s: the masking
patterns retried a run of key characters from every position in it (quadratic). The
cost is compared by ratio (1 MB against 100 kB, best of two), never by absolute time,
so a loaded machine does not decide the verdict: linear is ~10x, quadratic ~100x.
"""

from __future__ import annotations

import time

import pytest
from fallgate.fsm import TurnFailed
from fallgate.fsm import redact as redaction
from fallgate.providers import AsyncFallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

#: Runs that drove a pattern quadratic on main: key characters, stars, bullets,
#: scheme-like runs, a masked-piece lookalike, field names without values.
HOSTILE = ["x", "x-", "a1", "*", "•", "x*", "ab**", "a.b-", "token: ", "a://", "x@", "Aa1_"]


def _cost(text: str) -> float:
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        redaction.redact(text, ["hunter2-very-secret-key"])
        best = min(best, time.perf_counter() - start)
    return best


def _fill(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


@pytest.mark.parametrize("unit", HOSTILE)
def test_scrubbing_a_megabyte_costs_ten_times_a_hundred_kilobytes(unit: str) -> None:
    small, large = _cost(_fill(unit, 100_000)), _cost(_fill(unit, 1_000_000))
    assert large / small < 30, f"{unit!r}: 100 kB {small:.3f}s, 1 MB {large:.3f}s"


def test_a_run_of_32000_key_characters_is_masked_whole() -> None:
    assert redaction.redact("error: " + "x1" * 16_000) == "error: ***"


def test_text_beyond_the_bound_is_cut_and_what_is_cut_is_never_shown() -> None:
    key = "sk-proj-T3xq9LmZ0aB7cD2eF5gH8iJ1kN4oP6rS2uV9wY3zQ7zX"
    text = "word " * (redaction.MAX_TEXT // 5) + key + " tail" * 1000
    out = redaction.redact(text)
    assert len(out) <= redaction.MAX_TEXT + 64
    assert out.endswith("more characters cut]")
    assert key[8:] not in out and "tail" not in out
    # the cut keeps whole words: no half-key is left at the edge
    assert out.split("...[")[0].endswith("word ")


def test_a_long_run_at_the_bound_is_still_masked() -> None:
    out = redaction.redact("a1" * redaction.MAX_TEXT)
    assert out.startswith("***...[") and "a1a1" not in out


@pytest.mark.parametrize(
    "said",
    ["key starts hunter", "the key beginning with 'hunter' is invalid", "key hunter2... rejected"],
)
def test_a_six_character_prefix_a_provider_quotes_is_masked(said: str) -> None:
    out = redaction.redact(said, ["hunter2-very-secret-key"])
    assert "hunter" not in out, out


def test_pieces_of_a_masked_key_are_still_masked() -> None:
    for text in ["sk-proj-****abcd", "sk-ab...wxyz", "sk-ab…wxyz", "••••abcd", "sk-abc****"]:
        assert redaction.redact(f"bad key {text} here") == "bad key *** here", text


async def test_a_500_with_32000_x_ends_an_async_turn_well_inside_its_deadline() -> None:
    """The issue's case end to end (main: 19.9 s against a 10 s deadline, the event loop
    blocked 19 s): real SDK, real socket."""
    with FaultServer({"default": {"kind": "status", "status": 500, "body": "x" * 32_000}}) as srv:
        policy = chain("a", server=srv, max_attempts=1, deadline=10)
        async with AsyncFallgate(policy) as gate:
            start = time.perf_counter()
            with pytest.raises(TurnFailed, match="overloaded"):
                await gate.arun(messages=[{"role": "user", "content": "hi"}])
            assert time.perf_counter() - start < 5.0  # half the deadline: scrubbing is no wait
