"""After a context overflow: fallbacks known to be larger first, then those of unknown
context_length (issue 14, finding 8).

Before, a fallback without a configured ``context_length`` was skipped after any
overflow: with only the primary's length configured, the turn failed after one request
without trying a fallback. Now such fallbacks are tried after the ones known to be
larger, in chain order from the target whose overflow set the floor (which may mean
one move back up the chain). Checked on the pure core (both executors), by the model
checker, and end to end through the real SDK.
"""

from __future__ import annotations

import openai
import pytest
from fallgate.fsm import Turn, TurnFailed, instant_waits
from fallgate.fsm.checker import check_policy
from fallgate.fsm.core.machine import declare
from fallgate.fsm.core.turn import TransitionsTurn
from fallgate.fsm.host.scripted import play
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from fault_steps import CONTEXT_TOO_LONG_8K
from helpers import chain

ENGINES = [Turn, TransitionsTurn]
MSG = [{"role": "user", "content": "hi"}]



@pytest.mark.parametrize("engine", ENGINES)
def test_an_unknown_length_fallback_is_tried_when_only_the_primarys_is_known(engine):
    played = play(chain("big@8192", "other"), ["context_too_long", "success"], engine=engine)
    assert played.models == ["big", "other"]
    assert played.state == "done"


@pytest.mark.parametrize("engine", ENGINES)
def test_known_larger_fallbacks_come_before_unknown_ones(engine):
    """u1 comes first in the chain but its window is unknown: k2 (known larger) is tried
    first; when k2 fails too, the turn goes back to u1, never to a tried target."""
    policy = chain("p@8192", "u1", "k2@32768", "u3")
    played = play(policy, ["context_too_long", "not_found", "success"], engine=engine)
    assert played.models == ["p", "k2", "u1"]
    failing = play(
        policy, ["context_too_long", "not_found", "not_found", "not_found"], engine=engine
    )
    assert failing.models == ["p", "k2", "u1", "u3"]
    assert failing.state == "failed"


@pytest.mark.parametrize("engine", ENGINES)
def test_known_smaller_fallbacks_are_still_skipped(engine):
    policy = chain("p@8192", "small@4096", "u2")
    played = play(policy, ["context_too_long", "success"], engine=engine)
    assert played.models == ["p", "u2"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_unknown_target_that_overflows_does_not_send_the_turn_back(engine):
    """From a target of unknown length the turn only moves on down the chain."""
    policy = chain("p@8192", "u1", "u2")
    played = play(policy, ["context_too_long", "context_too_long", "success"], engine=engine)
    assert played.models == ["p", "u1", "u2"]


def _moves_back(models: tuple[str, ...]) -> set[tuple[str, str]]:
    """(source, dest) of every declared edge from a target's calling state to an
    earlier target."""
    decl = declare(chain(*models))
    index = {t.name: t.index for t in decl.policy.targets}
    return {
        (t.source, t.dest)
        for t in decl.edges()
        if t.source in index and t.dest in index and index[t.dest] < index[t.source]
    }


def test_the_move_back_is_declared_only_where_the_chain_allows_one():
    """fallback_2 (known length) may go back to fallback_1 (unknown, after the primary's
    known length); nothing else goes back, and chains without such a gap declare no
    move back at all."""
    assert _moves_back(("p@8192", "u1", "k2@32768")) == {("fallback_2", "fallback_1")}
    assert _moves_back(("a@8192", "b@4096", "c@100")) == set()
    assert _moves_back(("a", "b", "c")) == set()
    assert _moves_back(("a", "b@8192", "c@100")) == set()


@pytest.mark.parametrize(
    "models",
    [
        ("p@8192", "u1", "k2@32768"),
        pytest.param(("p@8192", "u1", "k2@32768", "u3"), marks=pytest.mark.slow),
        ("p@8192", "u1"),
        ("p", "u1@8192", "u2", "k3@32768"),
    ],
    ids=["gap", "gap-and-tail", "primary-only", "unknown-primary"],
)
def test_every_property_holds_with_unknown_context_lengths(models):
    """The checker explores every outcome sequence of these chains: the fallback gate
    (the first eligible target is the one taken, unknown-length ones last), no
    ping-pong (the one move back is to an untried unknown-length target) and the
    rest hold, and the move back is reachable."""
    report = check_policy(chain(*models, keys=1, max_attempts=1))
    assert report.ok, report.text()
    assert not [u for u in report.to_json()["unreachable"] if "context_too_long" in u]


def test_end_to_end_the_unknown_length_fallback_answers_after_an_overflow():
    """Through the real SDK: the primary (context_length 8192) answers 400
    context_length_exceeded; the fallback without a context_length answers. Before,
    the turn failed after that one request."""
    with FaultServer() as srv, instant_waits():
        srv.script(
            {
                "models": {
                    "small": [CONTEXT_TOO_LONG_8K],
                    "other": [{"kind": "answer", "text": "from the fallback"}],
                }
            }
        )
        policy = chain("small@8192", "other", server=srv, max_attempts=2)
        with Fallgate(policy) as gate:
            result = gate.run(messages=MSG)
        assert result.value.choices[0].message.content == "from the fallback"
        assert srv.counts == {"small": 1, "other": 1}


def test_end_to_end_every_fallback_failing_names_each_reason():
    with FaultServer() as srv, instant_waits():
        srv.script({"models": {"small": [CONTEXT_TOO_LONG_8K], "other": [CONTEXT_TOO_LONG_8K]}})
        policy = chain("small@8192", "other", server=srv, max_attempts=2)
        with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert srv.counts == {"small": 1, "other": 1}
        assert "context_too_long" in info.value.reasons["fallback_1"]
        assert isinstance(info.value.last_error, openai.BadRequestError)
