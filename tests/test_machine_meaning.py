"""The machine's meaning lives in one place: traits rows, self-describing guards, keyed state.

These tests keep the single sources honest: a kind without a traits row cannot
import, a guard's label names every policy field its predicate reads, and every
field of the turn state is either part of its identity (the checker's key) or
says why it cannot steer the turn.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fallgate.fsm import Policy, Turn
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.actions import Attempt, Rebuild, Wait
from fallgate.fsm.core.guards import GUARDS, Guard
from fallgate.fsm.core.state import TurnState
from fallgate.fsm.core.turn import observe
from fallgate.fsm.core.visit import Visit
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.kinds import _ROWS, FAULT_KINDS, TRAITS, Level, Outcome, OutcomeKind, _table


def test_every_outcome_kind_has_exactly_one_traits_row():
    assert set(TRAITS) == set(OutcomeKind)
    with pytest.raises(ImportError, match="missing \\['cancelled'\\]"):
        _table(_ROWS[:-1])
    with pytest.raises(ImportError, match="exactly one row"):
        _table((*_ROWS, _ROWS[0]))


def test_policy_validation_reads_the_traits_table():
    """What may be configured per kind is what its traits allow, nothing restated."""
    for kind in FAULT_KINDS:
        t = TRAITS[kind]
        rules = {"rotate": True} if not t.may_rotate else {"retry": True}
        data: dict[str, Any] = {"primary": {"provider": "openai", "model": "m"}}
        data["rules"] = {kind.value: rules}
        if t.may_rotate and t.may_retry:
            Policy.from_dict(data)  # allowed
        elif not t.may_rotate:
            with pytest.raises(Exception, match=f"rules.{kind.value}.rotate"):
                Policy.from_dict(data)
    assert {k for k in FAULT_KINDS if TRAITS[k].level is Level.CREDENTIAL} == {
        OutcomeKind.RATE_LIMITED,
        OutcomeKind.QUOTA,
        OutcomeKind.AUTH,
    }


class _Recorder:
    """A policy stand-in that remembers which fields were read."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self.read: set[str] = set()

    #: Methods that read one field for the caller: recorded as that field.
    READS_FIELD = {"rule": "rules", "reserve_for": "reserve", "most_reserve": "reserve"}

    def __getattr__(self, name: str) -> Any:
        self.read.add(self.READS_FIELD.get(name, name))
        return getattr(self._policy, name)


def _policy(assistant_prefix: bool = False, **extra: Any) -> Policy:
    keys: dict[str, Any] = {
        "api_keys": ["sk-a-123456", "sk-b-123456"],
        "base_url": "https://p.test/v1",
        "assistant_prefix": assistant_prefix,
    }
    return Policy.from_dict(
        {
            **extra,
            "primary": {"provider": "p0", "model": "m0", "context_length": 8000, **keys},
            "fallback_providers": [
                {"provider": "p1", "model": "m1", "context_length": 4000, **keys},
                {"provider": "p2", "model": "m2", "context_length": 128000, **keys},
            ],
            "max_attempts": 3,
            "retry_after_cap": 10,
            "deadline": 60,
            "attempt_timeout": 10,  # the reserve leaves time for retries before a fallback
        }
    )


_EVENTS = [
    Outcome(OutcomeKind.TRANSPORT),
    Outcome(OutcomeKind.RATE_LIMITED, retry_after=5),
    Outcome(OutcomeKind.RATE_LIMITED, retry_after=50),
    Outcome(OutcomeKind.RATE_LIMITED),
    Outcome(OutcomeKind.OVERLOADED, retry_after=3),
    Outcome(OutcomeKind.QUOTA),
    Outcome(OutcomeKind.CONTEXT_TOO_LONG),
    Outcome(OutcomeKind.AUTH),
    Outcome(OutcomeKind.STREAM_INTERRUPTED, partial="par"),
]


def _probe(turn: Turn, trigger: str, outcome: Outcome | None, reads: dict[Guard, set[str]]) -> None:
    """Evaluate every guard of the (state, trigger) group on a copy whose policy records."""
    s = turn.s
    for t in s.decl.groups().get((s.state, trigger), ()):
        if t.guard is None:
            continue
        c = s.copy(HealthStore(), s.clock)
        c.health = s.health  # reads only
        rec = _Recorder(s.policy)
        observe(c, trigger, outcome)
        c.policy = rec  # type: ignore[assignment]
        t.guard.check(c, t.arg)
        reads.setdefault(t.guard, set()).update(rec.read)


def test_every_guard_label_names_the_policy_fields_its_predicate_reads():
    """For every guard, over every turn of up to four outcomes from a varied alphabet,
    the policy fields the predicate reads are the fields its label is formatted from."""
    policies = [
        _policy(),
        _policy(prefer_waiting=True, assistant_prefix=True),
    ]
    reads: dict[Guard, set[str]] = {}
    scripts = itertools.chain.from_iterable(
        itertools.product(_EVENTS, repeat=n) for n in range(1, 4)
    )
    for policy, script in itertools.product(policies, scripts):
        health = HealthStore()
        clock = VirtualClock()
        turn = Turn(policy, health=health, clock=clock, random=lambda: 1.0)
        _probe(turn, "start", None, reads)
        action = turn.start()
        for o in script:
            if isinstance(action, Wait):
                clock.advance(action.seconds)
                _probe(turn, "waited", None, reads)
                action = turn.waited()
            elif isinstance(action, Rebuild):
                _probe(turn, "rebuilt", None, reads)
                action = turn.rebuilt(True)
            if not isinstance(action, Attempt):
                break
            _probe(turn, o.kind.value, o, reads)
            _probe(turn, "denied", None, reads)  # had the store refused the attempt
            action = turn.feed(o)
            if o.kind is OutcomeKind.QUOTA:  # another turn's report opens the breaker
                health.open_target(turn.s.target.key, clock() + 5.0, clock())
    assert set(reads) == set(GUARDS), "some guard was never evaluated"
    for guard, fields in reads.items():
        unnamed = fields - {"targets"} - guard.reads  # the chain itself is the structure
        assert not unnamed, f"{guard.name} reads {sorted(unnamed)} but its label does not say so"


def test_every_field_of_the_turn_state_is_keyed_or_says_why_not():
    for cls in (TurnState, Visit):
        slots = set(cls.__slots__)
        keyed, not_keyed = set(cls.KEYED), set(cls.NOT_KEYED)
        assert keyed | not_keyed == slots, (
            f"{cls.__name__}: unclassified {slots - keyed - not_keyed}"
        )
        assert not keyed & not_keyed
        assert all(why.strip() for why in cls.NOT_KEYED.values())


def test_a_visit_is_replaced_whole_when_the_turn_moves_on():
    from fallgate.fsm.host.scripted import play

    policy = _policy()
    seen: list[Visit] = []
    turn = Turn(policy, health=HealthStore(), clock=VirtualClock(), random=lambda: 1.0)
    turn.start()
    seen.append(turn.s.visit)
    turn.feed(Outcome(OutcomeKind.NOT_FOUND))
    seen.append(turn.s.visit)
    assert seen[0] is not seen[1]
    assert (seen[1].index, seen[1].attempts, seen[1].rotations) == (1, 1, 0)
    assert play(policy, ["transport", "not_found", "success"]).targets == [
        "primary",
        "primary",
        "fallback_1",
    ]


def test_the_checker_feeds_every_outcome_kind_with_every_abstract_retry_after_of_its_row():
    """The checker's alphabet is read off the traits table: a kind with a row is fed, a
    `connection_level` kind plain, marked `client_side` and `silent` (it took the
    attempt's whole bound), a `committed` one plain and marked `uncontinuable` when the
    policy continues streams."""
    from fallgate.fsm.checker.alphabet import alphabet
    from fallgate.fsm.checker.context import Bounds

    policy = _policy()
    ab = alphabet(policy, Bounds.of(policy))
    fed = [trigger for trigger, _ in ab.on_attempt]
    assert set(fed) == {k.value for k in OutcomeKind}
    for kind in FAULT_KINDS:
        t = TRAITS[kind]
        ways = 3 if t.connection_level else 2 if t.committed and policy.continues else 1
        assert fed.count(kind.value) == ways * len(t.retry_afters), kind
    marked = [k for k, args in ab.on_attempt if dict(args).get("client_side")]
    assert marked == [OutcomeKind.TRANSPORT.value]
    silent = [k for k, args in ab.on_attempt if dict(args).get("silent")]
    assert silent == [OutcomeKind.TRANSPORT.value]
    stuck = [k for k, args in ab.on_attempt if dict(args).get("uncontinuable")]
    assert stuck == [OutcomeKind.STREAM_INTERRUPTED.value]


def test_the_credential_level_kinds_are_stated_twice():
    """The checker's oracle reads which outcomes are the key's fault from the traits rows
    (`CREDENTIAL_KINDS`); this test is the independent statement (an engine bug must not
    be mirrored): moving a kind to or from credential level is a decision made twice."""
    from fallgate.fsm.checker.properties import CRED_LEVEL

    stated = {OutcomeKind.RATE_LIMITED, OutcomeKind.QUOTA, OutcomeKind.AUTH}
    assert {k for k in FAULT_KINDS if TRAITS[k].level is Level.CREDENTIAL} == stated
    assert set(CRED_LEVEL) == stated
