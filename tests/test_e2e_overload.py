"""1,000 concurrent turns against a healthy loopback server whose accept queue overflows.

The server (`bench.overload`, its own process) answers every request it reads at once,
but listens with a backlog of 8: a burst of 1,000 connects overflows it, connects time
out, and the turns see transport faults. fallgate (`AsyncFallgate`, default policy)
and the bare SDK (``max_retries=2``) run at the same time, each against a server of its
own, with the same attempt timeout, so that whatever else the machine does weighs on
both alike.

Before transport recovery was scoped to a client generation, every turn's recovery
rebuilt the clients all the turns shared (1,001 SDK clients for 1,000 turns), each
rebuild threw away the warm connections and sent a new wave of connects into the
overflowing queue, and fallgate answered none of its turns (0 of 1,000 in every run
here, against 976, 121 and 7 for the bare SDK under different loads).

Then, with the retry budget and the circuit breaker on by default, the first connect
timeouts of the burst emptied the budget (10 tokens) within milliseconds, the turns
after them failed without a retry and opened the breaker, which refused every other
turn: 185, 273 and 239 of 1,000 answered against 1,000 for the SDK. A transport fault
while the target answered other attempts is now a client-side fault (no token, no
breaker count, a backoff instead of a recovery): 1,000 of 1,000 in the runs at the
same load.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's bench/
from bench import overload

TURNS = 1000


@pytest.mark.timeout(600)
def test_a_thousand_concurrent_turns_rebuild_once_per_generation_and_answer_like_the_sdk():
    res = overload.measure(turns=TURNS, timeout=4.0)
    fg, bare = res["fallgate"], res["bare_sdk"]
    # How hard the burst hits depends on the machine: on a quiet one both answer every
    # turn without a fault; the rebuild storm needs faults to show (the deterministic
    # check of one rebuild per generation is in test_providers_pools.py).
    # One rebuild per client generation: turns that saw the same broken client share
    # one rebuild (a few generations at most over the run, never one per turn).
    assert fg["clients_built"] == 1 + fg["rebuilds"] <= 4, res
    # Answered like the SDK. On a machine shared with other jobs the burst saturates
    # the *client's* CPU as much as the server's queue, and then both mostly time out
    # and the run-to-run spread is large (measured here: 151 vs 64, 178 vs 219,
    # 1000 vs 976): half the SDK's count is the margin that spread needs, and still
    # fails the engine that rebuilt per turn (it answered none in every run) and the
    # one that spent retry tokens and breaker counts on client-side faults (185-273 vs
    # 1000). When the client's own event loop lags past the 4 s attempt timeout before
    # the target answered anyone (a CPU hog beside the run), no fault is a client-side
    # fault: the budget and the breaker stop the retries there, as they would for a
    # target that is down, and this margin is not met (see README "Overload").
    assert fg["answered"] >= bare["answered"] // 2, res
    # Every answer came from a request the server answered. Not every request it
    # answered reached a turn: on a loaded machine the attempt's total bound runs out
    # while the lagging loop has the reply unread, and the turn retries (979 answered
    # for 967 turns, 1175 for 1000, in two loaded runs; the SDK's timeouts do the same).
    assert fg["answered"] <= fg["server_answered"], res
