"""Declared but never taken: an edge whose guard cannot hold for a policy is not
declared for it, and every edge the checker leaves untaken is a finding with its
reason (a wait for the breaker's verdict needs other turns; anything else is a gap)."""

from __future__ import annotations

import pytest
from fallgate.fsm import Turn
from fallgate.fsm.checker import check_policy
from fallgate.fsm.checker.untaken import GAP, OTHER_TURNS
from fallgate.fsm.core.machine import declare
from fallgate.fsm.core.turn import TransitionsTurn
from fallgate.fsm.host.scripted import play

from helpers import chain


def _overflow_dests(policy, source):
    return sorted(
        t.dest
        for t in declare(policy).edges()
        if t.source == source and t.trigger == "context_too_long" and t.dest.startswith("fall")
    )


def test_a_context_overflow_declares_no_fallback_to_a_target_known_to_be_no_larger():
    """The overflow sets the floor to the overflowing target's length: a later target
    known to be no larger can never be eligible, so it has no edge; larger and unknown
    ones keep theirs, and a primary of unknown length keeps every one."""
    policy = chain("p@8192", "small@4096", "same@8192", "big@32768", "u")
    assert _overflow_dests(policy, "primary") == ["fallback_3", "fallback_4"]
    assert _overflow_dests(policy, "fallback_1") == ["fallback_2", "fallback_3", "fallback_4"]
    assert _overflow_dests(chain("p", "small@4096", "u"), "primary") == [
        "fallback_1",
        "fallback_2",
    ]


@pytest.mark.parametrize("engine", [Turn, TransitionsTurn])
def test_an_overflow_still_skips_the_smaller_fallback_and_answers_on_the_larger(engine):
    played = play(
        chain("p@8192", "small@4096", "big@32768"), ["context_too_long", "success"], engine=engine
    )
    assert played.models == ["p", "big"]
    assert played.state == "done"
    failing = play(chain("p@8192", "small@4096"), ["context_too_long"], engine=engine)
    assert failing.models == ["p"]
    assert failing.state == "failed"


@pytest.mark.slow  # a three-key, three-attempt fallback: half a minute of search
def test_every_edge_left_untaken_is_a_finding_with_its_reason():
    """The fallback has three keys and three attempts: every key is an attempt, so a 429
    wait there needs a key an earlier turn benched, which only a next turn has (and the
    check follows a next turn two events): a gap, said as such. The verdict waits need
    other turns. Nothing untaken goes unexplained, in the text and in the JSON."""
    report = check_policy(chain("m", "f", keys=(1, 3), max_attempts=3))
    assert report.ok, report.text()
    data = report.to_json()
    untaken = data["untaken"]
    assert [u["edge"] for u in untaken] == data["unreachable"] and untaken
    assert {u["finding"] for u in untaken} == {GAP, OTHER_TURNS}
    for u in untaken:
        if u["finding"] == OTHER_TURNS:
            assert "the breaker open or another turn probing" in u["edge"], u
        else:
            assert u["edge"].startswith("fallback_1_rate_limited "), u
            assert "entered only by a next turn" in u["why"], u
    text = report.text()
    assert f"declared but never taken ({len(untaken)}: " in text
    assert "gap: fallback_1_rate_limited is entered only by a next turn" in text
