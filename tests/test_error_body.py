"""fsm.catalogue.error_body and the status rules around it: which field decides, and that no
body, however odd, makes classification raise.

The real bodies live in the catalogue (tests/test_error_catalogue.py); these pin the
precedence rules one by one on small bodies, and fuzz the reader."""

from __future__ import annotations

import json
import time
from typing import Any

from fallgate.fsm import OutcomeKind
from fallgate.fsm.catalogue.classify import classify_status
from fallgate.fsm.catalogue.error_body import parse, read
from hypothesis import given, settings
from hypothesis import strategies as st

K = OutcomeKind


def err(**fields: Any) -> dict[str, Any]:
    return {"error": fields}


def test_a_structured_type_beats_a_server_status():
    """llama.cpp once sent its overflow type with a 500: retrying would overflow again."""
    o = classify_status(500, None, err(type="exceed_context_size_error", message="x"))
    assert o.kind is K.CONTEXT_TOO_LONG


def test_words_alone_do_not_turn_a_server_error_into_a_client_one():
    o = classify_status(500, None, err(message="This model's maximum context length is 8192"))
    assert o.kind is K.OVERLOADED


def test_words_in_a_429_decide_only_for_a_spent_balance_or_an_overloaded_server():
    assert classify_status(429, None, err(message="model foo not found")).kind is K.RATE_LIMITED
    assert classify_status(429, None, err(message="Insufficient Balance")).kind is K.QUOTA
    assert classify_status(429, None, err(message="Overloaded")).kind is K.OVERLOADED


def test_overloaded_words_in_a_400_are_no_server_fault():
    assert classify_status(400, None, err(message="the tool overloaded")).kind is K.BAD_REQUEST


def test_a_408_stays_a_transport_fault_whatever_its_body_says():
    assert classify_status(408, None, err(code="insufficient_quota")).kind is K.TRANSPORT


def test_quota_carries_no_retry_after_even_when_the_server_sends_one():
    """The key is benched for the cooldown cap: a "retry in 5s" on a spent balance or a
    day's quota would put it back in rotation in seconds."""
    o = classify_status(
        402, {"retry-after": "5"}, err(message="Insufficient credits"), now=time.time()
    )
    assert (o.kind, o.retry_after) == (K.QUOTA, None)
    r = classify_status(429, {"retry-after": "5"}, err(message="slow down"), now=time.time())
    assert (r.kind, r.retry_after) == (K.RATE_LIMITED, 5.0)


def test_per_minute_quota_ids_stay_a_rate_limit_and_per_day_ones_are_quota():
    def body(*ids: str) -> dict[str, Any]:
        violations = [{"quotaId": i} for i in ids]
        return err(status="RESOURCE_EXHAUSTED", details=[{"violations": violations}])

    minute = read(body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"))
    day = read(body("GenerateRequestsPerDayPerProjectPerModel"))
    both = read(body("GenerateRequestsPerMinutePerProjectPerModel", "GenerateRequestsPerDay"))
    assert minute is not None and minute.kind is K.RATE_LIMITED
    assert day is not None and day.kind is K.QUOTA
    assert both is not None and both.kind is K.QUOTA


def test_a_request_within_the_limit_is_a_rate_limit_one_above_it_is_quota():
    within = "Rate limit reached on tokens per minute (TPM): Limit 6000, Used 5000, Requested 2000"
    above = "Request too large on tokens per minute (TPM): Limit 6000, Requested 14137"
    a = read(err(message=within, type="tokens", code="rate_limit_exceeded"))
    b = read(err(message=above, type="tokens", code="rate_limit_exceeded"))
    assert a is not None and a.kind is K.RATE_LIMITED
    assert b is not None and b.kind is K.QUOTA


def test_a_numeric_business_code_means_nothing_outside_its_provider():
    """z.ai's 1113 is quota through the registry only; to the generic reader it is
    just a number."""
    assert read(err(code="1113", message="something")) is None


def test_nested_and_listed_errors_are_read_through():
    inner = json.dumps(
        err(code=400, status="INVALID_ARGUMENT", details=[{"reason": "API_KEY_INVALID"}])
    )
    b = parse(err(message=inner, code=400, status="Bad Request"))
    assert "INVALID_ARGUMENT" in b.codes and b.reasons == ("API_KEY_INVALID",)
    listed = read([err(code=503, status="UNAVAILABLE", message="x")])
    assert listed is not None and listed.kind is K.OVERLOADED


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "error",
                    "message",
                    "code",
                    "type",
                    "status",
                    "details",
                    "violations",
                    "quotaId",
                    "reason",
                    "innererror",
                    "detail",
                    "x",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(body=JSON | st.text(max_size=200) | st.binary(max_size=200), status=st.integers(100, 999))
def test_no_body_makes_classification_raise(body: Any, status: int) -> None:
    """Whatever a server sends (any JSON shape, text, bytes, any status), reading it
    returns a class or nothing, and classify_status an outcome."""
    r = read(body)
    assert r is None or isinstance(r.kind, OutcomeKind)
    if isinstance(body, dict | list):
        read(json.dumps(body))
    o = classify_status(status, {}, body, now=0.0)
    assert isinstance(o.kind, OutcomeKind)


def test_a_deeply_nested_or_huge_body_is_read_without_error():
    """Nesting is followed a few levels only, text is read up to 8 KiB: a hostile body
    neither recurses without bound nor raises."""
    deep: Any = "x"
    for _ in range(5000):
        deep = {"error": deep}
    assert read(deep) is None
    assert read("[" * 100_000) is None
    big = read(json.dumps(err(message="model " * 20_000 + "x does not exist")))
    assert big is None  # the wording lies beyond the 8 KiB that are read


def test_a_balance_error_is_quota_in_any_client_status():
    """Issue 14 met billing errors as 400 and 412 too; the status does not matter once
    the body names a spent balance (a code, or the words)."""
    for status in (400, 402, 403, 409, 412, 422, 429):
        by_words = classify_status(status, None, err(message="Insufficient Balance"))
        by_code = classify_status(status, None, err(code="insufficient_balance", message="x"))
        assert by_code.kind is K.QUOTA, status
        assert by_words.kind is K.QUOTA, status
