"""What the adapter marks as a client-side fault (`Outcome.client_side`).

A transport fault is the target's unless the client knows better: the pool saw the
target answer other attempts while this one was out, or the attempt's time ran out
before its first network operation (a thousand turns on one busy event loop: the
target never saw the request). Anything else, and any other kind, is left as it was.
"""

from __future__ import annotations

import time
import types

import openai
import pytest
from fallgate.fsm import OutcomeKind
from fallgate.providers.bounds import AttemptBound, AttemptTimeout, _limit
from fallgate.providers.classify import classifier_for
from fallgate.providers.transport import http as httpx

from helpers import chain

_CORE = types.SimpleNamespace(ConnectTimeout=TimeoutError, ReadTimeout=TimeoutError)


def test_a_bound_that_ran_out_before_the_first_network_operation_says_so():
    bound = AttemptBound(0.01, 1024)
    time.sleep(0.02)  # the client was busy: the connect never started
    with pytest.raises(TimeoutError):
        _limit(bound, None, _CORE, "ConnectTimeout")
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and err.unsent
    assert "before it reached the network" in str(err)


def test_a_bound_that_ran_out_after_a_network_operation_does_not():
    bound = AttemptBound(0.05, 1024)
    _limit(bound, None, _CORE, "ConnectTimeout")  # the connect started in time
    time.sleep(0.06)
    with pytest.raises(TimeoutError):
        _limit(bound, None, _CORE, "ReadTimeout")
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and not err.unsent


def _status_error(status: int) -> openai.APIStatusError:
    req = httpx.Request("POST", "https://p0.test/v1/chat/completions")
    resp = httpx.Response(status, request=req, json={"error": {"message": "busy"}})
    return openai.APIStatusError("busy", response=resp, body=None)


@pytest.mark.parametrize(
    ("error", "answered", "client_side"),
    [
        (AttemptTimeout("attempt exceeded its 4 s total time bound", unsent=True), False, True),
        (AttemptTimeout("attempt exceeded its 4 s total time bound"), False, False),
        (AttemptTimeout("attempt exceeded its 4 s total time bound"), True, True),
        (openai.APIConnectionError(request=httpx.Request("POST", "https://p0.test")), True, True),
        (_status_error(503), True, False),  # the server itself said no: the target's
    ],
)
def test_the_classifier_marks_transport_faults_the_client_knows_are_its_own(
    error, answered, client_side
):
    policy = chain("m0")
    target = policy.targets[0]
    classify = classifier_for(policy, lambda: target, lambda t: answered)
    o = classify(error)
    assert o.client_side is client_side, o
    if client_side:
        assert o.kind is OutcomeKind.TRANSPORT
