"""Deployment groups and conversation affinity: the policy shape, the router's order,
the checker on every member order, and the whole path end to end (the real openai SDK
against one fault server per deployment)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from fallgate.fsm import Outcome, OutcomeKind, Policy, PolicyError, VirtualClock, instant_waits
from fallgate.fsm import run as fsm_run
from fallgate.fsm.checker import check_policy
from fallgate.fsm.core.members import release, route
from fallgate.fsm.health.routes import Routes, routes_of
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.policy.groups import spans
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import KEY_PREFIX, key

A, B, C = "https://a.test/v1", "https://b.test/v1", "https://c.test/v1"


def grouped(*urls: str, keys: int = 1, **fields: Any) -> Policy:
    """A primary group of one member per url (each with `keys` keys), then a fallback."""
    members = [
        {"base_url": u, "api_keys": [key(i, k) for k in range(keys)]} for i, u in enumerate(urls)
    ]
    return Policy.from_dict(
        {
            "primary": {"provider": "fault", "model": "m", "members": members},
            "fallback_providers": [
                {"provider": "fault", "model": "small", "base_url": C, "api_key": key(9)}
            ],
            **fields,
        }
    )


# -- the policy ------------------------------------------------------------------------------


def test_a_group_keeps_one_place_in_the_chain_and_its_members_their_names():
    p = grouped(A, B)
    assert [t.name for t in p.targets] == ["primary_m1", "primary_m2", "fallback_1"]
    assert [t.entry for t in p.targets] == [0, 0, 1]
    assert spans(p.targets) == (range(0, 2),)
    assert not p.targets[0].same_as(p.targets[1]), "members are other deployments"


@pytest.mark.parametrize(
    ("entry", "path", "says"),
    [
        (
            {"members": [{"base_url": A, "api_key": key(0)}, {"base_url": A, "api_key": key(1)}]},
            "primary.members[1].base_url",
            "same backend",
        ),
        ({"weight": 2, "members": [{"base_url": A, "api_key": key(0)}]}, "primary.weight", "per"),
        (
            {"members": [{"base_url": A, "api_key": key(0), "group": "x"}]},
            "primary.members[0].group",
            "belongs to its entry",
        ),
        ({"members": []}, "primary.members", "list of 1 to 16"),
        ({"members": [{"base_url": A, "api_key": key(0), "weight": 0}]}, "weight", "> 0"),
    ],
)
def test_a_bad_group_is_refused_naming_the_field(entry, path, says):
    with pytest.raises(PolicyError) as e:
        Policy.from_dict({"primary": {"provider": "fault", "model": "m", **entry}})
    assert path in str(e.value) and says in str(e.value)


def test_two_entries_under_one_group_name_are_refused():
    member = {"provider": "fault", "model": "m", "group": "g", "api_key": key(0)}
    with pytest.raises(PolicyError, match=r"targets\[2\]\.group = 'g': group 'g' is already"):
        Policy.from_dict(
            {
                "targets": [
                    {**member, "base_url": A},
                    {"provider": "fault", "model": "x", "base_url": C, "api_key": key(1)},
                    {**member, "base_url": B},
                ]
            }
        )


@pytest.mark.parametrize("named", [True, False], ids=["group-named", "named-after-model"])
def test_two_adjacent_group_entries_under_one_name_are_refused_not_merged(named):
    """Next to each other, two entries of one group name would read as one group of
    both entries' members: the fallback the user declared would be a member of the
    primary. Refused, naming the second entry and the first."""
    label = {"group": "g"} if named else {}
    with pytest.raises(PolicyError) as e:
        Policy.from_dict(
            {
                "primary": {
                    "provider": "fault",
                    "model": "m",
                    **label,
                    "members": [{"base_url": A, "api_key": key(0)}],
                },
                "fallback_providers": [
                    {
                        "provider": "fault",
                        "model": "m" if not named else "other",
                        **label,
                        "members": [{"base_url": B, "api_key": key(1)}],
                    }
                ],
            }
        )
    field = "group" if named else "members"
    assert f"fallback_providers[0].{field} = 'g" in str(e.value) or (
        not named and "fallback_providers[0].members = 'm'" in str(e.value)
    )
    assert "is already primary's" in str(e.value)


def test_a_chain_built_in_python_keeps_a_group_to_one_run_of_targets():
    t = {"provider": "fault", "model": "m", "group": "g", "api_key": key(0)}
    targets = [
        Policy.from_dict({"primary": {**t, "base_url": u}}).targets[0] for u in (A, C, B)
    ]
    targets[1] = attrs.evolve(targets[1], group=None, model="x")
    with pytest.raises(PolicyError, match=r"targets\[2\]\.group = 'g': the members of a group"):
        Policy(targets=targets)


def test_a_member_inherits_the_entry_fields_it_leaves_out():
    p = Policy.from_dict(
        {
            "primary": {
                "provider": "fault",
                "model": "m",
                "context_length": 8192,
                "api_key": key(0),
                "members": [{"base_url": A}, {"base_url": B, "api_key": key(1), "model": "m2"}],
            }
        }
    )
    m1, m2 = p.targets
    assert (m1.model, m1.context_length, m1.credentials[0].id) == ("m", 8192, "key#1")
    assert (m2.model, m2.context_length) == ("m2", 8192)
    assert m2.credentials[0].key.reveal() == key(1)  # its own key, not the entry's


# -- the router -------------------------------------------------------------------------------


def order(p: Policy, health: HealthStore, affinity: str | None = None, now: float = 0.0):
    """The routed chain's names (the turn is ended at once: it is not left in flight)."""
    routed = route(p, health, affinity, now)
    release(routed)
    return [t.name for t in routed.policy.targets]


def test_a_policy_without_groups_is_not_rerouted():
    p = Policy.from_dict({"primary": {"provider": "fault", "model": "m", "base_url": A,
                                      "api_key": key(0)}})
    h = HealthStore()
    assert route(p, h, "conv", 0.0).policy is p


def test_a_member_that_is_cooling_goes_after_the_free_ones():
    p = grouped(A, B)
    h = HealthStore()
    assert order(p, h) == ["primary_m1", "primary_m2", "fallback_1"]
    h.open_target(p.targets[0].key, until=50.0, now=0.0)
    assert order(p, h, now=1.0) == ["primary_m2", "primary_m1", "fallback_1"]
    assert order(p, h, now=60.0)[0] == "primary_m1", "free again: back to its rank"


def test_the_faster_member_goes_first_and_weight_outweighs_speed():
    p = grouped(A, B)
    h = HealthStore()
    routes = routes_of(h)
    routes.measured(p.targets[0].key, 0.4)
    routes.measured(p.targets[1].key, 0.1)
    assert order(p, h)[0] == "primary_m2"
    heavy = Policy.from_dict(
        {
            "primary": {
                "provider": "fault",
                "model": "m",
                "members": [
                    {"base_url": A, "api_key": key(0), "weight": 8},
                    {"base_url": B, "api_key": key(1)},
                ],
            }
        }
    )
    assert order(heavy, h)[0] == "primary_m1", "0.4 s / 8 beats 0.1 s / 1"


def test_turns_in_flight_spread_a_group():
    p = grouped(A, B)
    h = HealthStore()
    firsts = [route(p, h, None, 0.0).policy.targets[0].name for _ in range(4)]
    assert firsts == ["primary_m1", "primary_m2", "primary_m1", "primary_m2"]


def test_a_pin_leads_while_its_member_and_key_are_free():
    p = grouped(A, B, keys=2)
    h = HealthStore()
    m2 = p.targets[1]
    routes_of(h).set_pin("conv", "m", (m2.key, m2.credentials[1].health_id), 0.0)
    routed = route(p, h, "conv", 0.0).policy
    assert routed.targets[0].name == "primary_m2"
    assert routed.targets[0].credentials[0].id == "key#2", "the pinned key goes first"
    h.cool_credential(m2.key, m2.credentials[1].health_id, until=30.0, now=0.0)
    routed = route(p, h, "conv", 1.0).policy
    assert routed.targets[0].name == "primary_m2" and routed.targets[0].credentials[0].id == "key#1"
    h.open_target(m2.key, until=30.0, now=0.0)
    assert order(p, h, "conv", 2.0)[0] == "primary_m1", "a pin never outranks health"


def test_pins_are_bounded_and_expire():
    r = Routes(max_pins=2, pin_ttl=10.0)
    pin = (("u", "m"), "k")
    for n in ("a", "b", "c"):
        r.set_pin(n, "g", pin, 0.0)
    assert r.pins() == 2 and r.pin("a", "g", 1.0) is None, "least recently used out"
    assert r.pin("c", "g", 5.0) == pin
    assert r.pin("c", "g", 16.0) is None, "idle past its ttl"


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 4),
    cooling=st.lists(st.booleans(), min_size=4, max_size=4),
    latency=st.lists(st.none() | st.floats(0.01, 5.0), min_size=4, max_size=4),
    pinned=st.none() | st.integers(0, 3),
)
def test_routing_permutes_members_only_and_never_puts_a_cooling_member_first(
    n, cooling, latency, pinned
):
    """For any health, latencies and pin: the routed chain holds each group's members,
    permuted within the group's span, every other target where it was, names unchanged;
    and a member that is cooling never goes before a free one."""
    urls = [f"https://m{i}.test/v1" for i in range(n)]
    p = grouped(*urls)
    h = HealthStore()
    routes = routes_of(h)
    for i in range(n):
        if cooling[i]:
            h.open_target(p.targets[i].key, until=100.0, now=0.0)
        if latency[i] is not None:
            routes.measured(p.targets[i].key, latency[i])
    if pinned is not None and pinned < n:
        t = p.targets[pinned]
        routes.set_pin("c", "m", (t.key, t.credentials[0].health_id), 0.0)
    routed = route(p, h, "c", 1.0).policy.targets
    assert sorted(t.name for t in routed[:n]) == sorted(t.name for t in p.targets[:n])
    assert routed[n].name == "fallback_1"
    states = [cooling[t.member - 1] for t in routed[:n]]
    assert states == sorted(states), f"a cooling member before a free one: {states}"
    if pinned is not None and pinned < n and not cooling[pinned]:
        assert routed[0].member == pinned + 1


# -- the engine and the checker ------------------------------------------------------------------


def test_a_failing_member_is_left_for_the_next_member_before_the_chain_moves_on():
    p = grouped(A, B)
    calls: list[str] = []

    def call(t, c):
        calls.append(t.name)
        if t.name == "primary_m1":
            raise RuntimeError("503")
        return "ok"

    r = fsm_run(
        p,
        call,
        health=HealthStore(),
        clock=VirtualClock(),
        classify=lambda e: Outcome(OutcomeKind.OVERLOADED, status=503),
    )
    assert calls == ["primary_m1", "primary_m2"] and r.target == "primary_m2"
    assert [e.dest for e in r.trace] == ["primary_m1", "primary_m2", "done"]


@pytest.mark.parametrize("members", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_the_checker_proves_every_property_on_every_member_order(members):
    """Every order the router may hand a turn is itself a policy: each is checked."""
    p = grouped(A, B, max_attempts=2, deadline=10, attempt_timeout=2, keys=members)
    for perm in itertools.permutations(range(2)):
        ordered = attrs.evolve(p, targets=[p.targets[i] for i in perm] + [p.targets[2]])
        report = check_policy(ordered, turns=1)
        assert report.ok, report.text()


# -- end to end --------------------------------------------------------------------------------

ANSWER = {"kind": "answer", "text": "fine"}


@pytest.fixture
def servers() -> Iterator[list[FaultServer]]:
    with FaultServer() as a, FaultServer() as b, FaultServer() as c:
        yield [a, b, c]


def e2e_policy(servers: list[FaultServer], **fields: Any) -> Policy:
    a, b, c = servers
    return Policy.from_dict(
        {
            "primary": {
                "provider": "fault",
                "model": "m",
                "members": [
                    {"base_url": a.base_url, "api_key": key(0)},
                    {"base_url": b.base_url, "api_key": key(1)},
                ],
            },
            "fallback_providers": [
                {"provider": "fault", "model": "small", "base_url": c.base_url, "api_key": key(2)}
            ],
            **fields,
        }
    )


def test_e2e_a_member_down_is_left_for_the_other_member_not_the_fallback(servers):
    a, b, c = servers
    a.script({"models": {"m": [{"kind": "status", "status": 503}]}})
    b.script({"models": {"m": [ANSWER]}})
    c.script({"models": {"small": [ANSWER]}})
    with instant_waits(), Fallgate(e2e_policy(servers), health=HealthStore()) as gate:
        result = gate.run(messages=[{"role": "user", "content": "hi"}])
    assert result.target == "primary_m2"
    assert (a.counts, b.counts, c.counts) == ({"m": 1}, {"m": 1}, {})
    assert [e.dest for e in result.trace] == ["primary_m1", "primary_m2", "done"]


def conversation(
    gate: Fallgate, turns: int, *, affinity: bool, lure: int | None = None
) -> list[tuple[str, int]]:
    """`turns` turns of one conversation: (member that answered, cached prompt tokens).
    From turn `lure` on, the member that did not answer the last turn is made to look
    ten times faster (its measured latency) before every turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "you are terse " * 20}]
    out: list[tuple[str, int]] = []
    policy, routes = gate.policy, routes_of(gate.health)
    for n in range(turns):
        if lure is not None and n >= lure:
            last = out[-1][0]
            for t in policy.targets[:2]:
                routes.measured(t.key, 1.0 if t.name == last else 0.1)
        messages.append({"role": "user", "content": f"question {n}"})
        extra = {"prompt_cache_key": "conv-1"} if affinity else {}
        r = gate.run(messages=messages, **extra)
        details = r.value.usage.prompt_tokens_details
        out.append((r.target, details.cached_tokens if details else 0))
        messages.append({"role": "assistant", "content": r.value.choices[0].message.content})
    return out


def test_e2e_a_conversation_stays_on_its_member_and_hits_its_prompt_cache(servers):
    for s in servers:
        s.script({"models": {"m": [ANSWER] * 50, "small": [ANSWER] * 50}})
    with Fallgate(e2e_policy(servers), health=HealthStore()) as gate:
        served = conversation(gate, 8, affinity=True, lure=2)
    members = {m for m, _ in served}
    assert len(members) == 1, served
    assert all(cached > 0 for _, cached in served[1:]), served
    assert served[0][1] == 0


def test_e2e_without_affinity_the_faster_member_takes_the_turn_and_its_cache_is_cold(servers):
    """The contrast: the same conversation without a conversation key follows speed, and
    each move lands on a deployment whose cache has not seen its prefix."""
    for s in servers:
        s.script({"models": {"m": [ANSWER] * 50, "small": [ANSWER] * 50}})
    with Fallgate(e2e_policy(servers), health=HealthStore()) as gate:
        served = conversation(gate, 4, affinity=False, lure=2)
    assert served[2][0] != served[1][0] and served[2][1] == 0, served


def test_e2e_a_conversation_repins_once_after_its_member_fails(servers):
    a, b, _ = servers
    for s in servers:
        s.script({"models": {"m": [ANSWER] * 50, "small": [ANSWER] * 50}})
    with instant_waits(), Fallgate(e2e_policy(servers), health=HealthStore()) as gate:
        first = conversation(gate, 3, affinity=True)
        pinned = first[0][0]
        down = a if pinned == "primary_m1" else b
        down.script({"models": {"m": [{"kind": "status", "status": 503}] + [ANSWER] * 50}})
        after = conversation(gate, 6, affinity=True)
    others = {m for m, _ in after}
    assert pinned not in others and len(others) == 1, (pinned, after)
    assert down.count("m") == 1, "the failed member was tried once, then the pin moved"
    assert all(cached > 0 for _, cached in after[2:]), after


def test_e2e_no_key_is_shown_in_what_a_group_reports(servers):
    policy = e2e_policy(servers)
    text = repr(policy) + str([t.name for t in policy.targets])
    assert KEY_PREFIX not in text


def test_e2e_affinity_is_fallgates_own_argument_and_is_never_sent(servers):
    a, b, _ = servers
    for s in servers:
        s.script({"models": {"m": [ANSWER] * 5}})
    with Fallgate(e2e_policy(servers), health=HealthStore()) as gate:
        msgs = [{"role": "user", "content": "hi"}]
        first = gate.run(messages=msgs, affinity="conv-9")
        routes_of(gate.health).measured(
            next(t.key for t in gate.policy.targets if t.name != first.target), 0.0001
        )
        again = gate.run(messages=msgs, affinity="conv-9")
    assert again.target == first.target, "pinned, though the other member looks faster"
    bodies = [r.body for r in a.requests + b.requests]
    assert bodies and all("affinity" not in body for body in bodies)


def test_a_group_is_drawn_member_by_member():
    """The diagram draws each member's state and the move from one member to the next."""
    from fallgate.fsm.core.machine import declare
    from fallgate.fsm.diagram.render import to_mermaid

    text = to_mermaid(declare(grouped(A, B)))
    assert "s_primary_m1 --> s_primary_m2 : fault" in text
    assert "[next eligible = primary_m2" in text and "s_primary_m2 --> s_fallback_1" in text
    assert KEY_PREFIX not in text


def test_a_model_named_in_a_group_starts_the_turn_at_the_group():
    """``model=`` naming any member starts the chain at its group's place: the router's
    order decides which member goes first, never the member's declared rank."""
    from fallgate.providers.openai.chain import Chains

    chains = Chains(grouped(A, B))
    assert chains.index("primary_m2") == chains.index("m") == 0
    assert chains.index("small") == 2
