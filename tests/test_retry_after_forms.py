"""Every Retry-After form of RFC 9110, duplicated headers included, and a Retry-After
longer than the cooldown cap still gets a probe at the cap (issue 24, finding 6).

On main two ``Retry-After: 3`` headers (or one ``3, 3``) were ignored (the retry came
after 0.51 s), and one 503 with ``Retry-After: 99999999999`` benched a healthy backend
for 24 h with no probe.
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterator

import pytest
from fallgate.fsm import HealthStore, TurnFailed, instant_waits
from fallgate.fsm.catalogue.retry_after import parse_retry_after
from fallgate.fsm.health import records as fleet
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
NOW = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def _imf(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("3", 3.0),
        ("3, 3", 3.0),
        ("3,7", 7.0),  # two values: the longer wait
        (_imf(NOW + 40), 40.0),  # IMF-fixdate
        (f"{_imf(NOW + 40)}, {_imf(NOW + 40)}", 40.0),  # a date, sent twice
        ("Tuesday, 14-Nov-23 22:14:00 GMT", 1_700_000_040.0 - NOW),  # RFC 850
        ("Tue Nov 14 22:14:00 2023", 1_700_000_040.0 - NOW),  # asctime (no zone: GMT)
        (f"5, {_imf(NOW + 40)}", 40.0),
    ],
)
def test_every_rfc_9110_form_is_read(value: str, seconds: float) -> None:
    assert parse_retry_after({"Retry-After": value}, None, NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("headers", [{"retry-after": ["3", "3"]}, {"retry-after": "3, 3"}])
def test_a_duplicated_retry_after_through_the_sdk_is_honoured(
    fault_server: FaultServer, headers: dict[str, object]
) -> None:
    fault_server.script({"default": {"kind": "status", "status": 429, "headers": headers}})
    policy = chain("a", server=fault_server, max_attempts=2)
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
        gate.run(messages=MSG)
    assert "Retry-After 3s" in info.value.reasons["primary"], info.value.reasons


def test_a_huge_retry_after_opens_the_breaker_for_the_cooldown_cap_then_probes() -> None:
    policy = chain("a")
    record = fleet.fail({}, NOW, policy, 99_999_999_999.0, "turn-1")
    assert fleet.num(record, "until") == NOW + policy.cooldown.cap
    assert fleet.is_half_open(record, NOW + policy.cooldown.cap)  # the next attempt probes


def test_a_backend_told_to_wait_a_day_is_probed_at_the_cap_end_to_end(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 503, "headers": {"retry-after": "99999999999"}}]
            },
            "default": {"kind": "answer"},
        }
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1, cooldown={"cap": 60})
    health = HealthStore()
    with Fallgate(policy, health=health) as gate:
        assert gate.run(messages=MSG).model == "b"
    until = health.target_until(policy.targets[0].key)
    assert 0 < until and until - max(r.time for r in fault_server.requests) <= 61
