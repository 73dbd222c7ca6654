"""Replies taken for what they are not (issue 24, finding 7), through the real SDK.

A z.ai plan's five-hour window (1308) names when it resets: the key is benched until
then, not for half a second as a rate limit (every later turn spent a request on a key
dead for hours); a 3xx without a Location is no API reply (it was `bad_request`: no
fallback). The catalogue's bodies (tests/data/error_catalogue.json) hold the rest.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fallgate.fsm import OutcomeKind, instant_waits
from fallgate.fsm.catalogue.classify import classify_status
from fallgate.fsm.catalogue.error_body import quota_reset

from fallgate import Fallgate, HealthStore
from fallgate.testing import FaultServer

from helpers import chain, key

MSG = [{"role": "user", "content": "hi"}]
BEIJING = 8 * 3600


def zai_1308(seconds_from_now: float) -> dict[str, Any]:
    """z.ai's 429 for a spent five-hour window, its reset in Beijing time
    (https://github.com/hugalafutro/model-hotel/pull/955, https://docs.z.ai/api-reference/api-code)."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + seconds_from_now + BEIJING))
    return {
        "error": {
            "code": "1308",
            "message": f"Usage limit reached for 5 hour. Your limit will reset at {at}",
        }
    }


def test_a_spent_five_hour_window_benches_the_key_until_its_reset() -> None:
    body = zai_1308(3 * 3600)
    with FaultServer() as srv, instant_waits() as clock:
        srv.script({"models": {"glm": [{"kind": "status", "status": 429, "body": body}]}})
        policy = chain("glm", server=srv, provider="zai", keys=2, max_attempts=3)
        with Fallgate(policy, health=HealthStore()) as gate:
            result = gate.run(messages=MSG)
            t = policy.targets[0]
            first, second = t.pool()
            benched = gate.health.credential_until(t.key, first.health_id) - clock()
            assert gate.health.credential_until(t.key, second.health_id) == 0.0
            assert "quota" in [e.event for e in result.trace]
            again = gate.run(messages=MSG)  # the next turn does not ask the dead key
        assert result.value.choices[0].message.content == "ok"
        assert again.value.choices[0].message.content == "ok"
        assert [r.api_key for r in srv.requests] == [key(0, 0), key(0, 1), key(0, 1)]
    assert benched == pytest.approx(3 * 3600, abs=60)


def test_the_five_hour_window_is_quota_by_its_words_at_any_provider() -> None:
    o = classify_status(429, {}, zai_1308(600), now=time.time())
    assert o.kind is OutcomeKind.QUOTA
    assert o.retry_after == pytest.approx(600, abs=5)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Your limit will reset at 2020-01-01 00:00:00", None),  # past: the cooldown cap
        ("Your limit will reset at 2999-01-01 00:00:00", None),  # beyond 40 days: not believed
        ("Your limit will reset at 2026-13-45 99:00:00", None),  # not a date
        ("Usage limit reached", None),
    ],
)
def test_a_reset_that_is_past_far_or_malformed_is_not_used(message: str, expected: Any) -> None:
    assert quota_reset({"error": {"code": "1308", "message": message}}, time.time()) == expected


@pytest.mark.parametrize("status", [300, 304])
def test_a_3xx_without_a_location_falls_back(status: int) -> None:
    assert classify_status(status).kind is OutcomeKind.NOT_FOUND
    with FaultServer() as srv:
        srv.script({"models": {"m0": [{"kind": "status", "status": status, "body": ""}]}})
        with Fallgate(chain("m0", "m1", server=srv), health=HealthStore()) as gate:
            result = gate.run(messages=MSG)
    assert result.target == "fallback_1"
    assert result.value.choices[0].message.content == "ok"
