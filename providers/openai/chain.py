"""The chain as the SDK surface sees it: a per-call ``model=``, and ``models.list()``.

``model=`` on a call names where the turn's chain starts: an entry's model
(``"glm-4.7"``), its ``provider/model`` (``"zai/glm-4.7"``) or its target name
(``"fallback_1"``). The turn then tries that entry and the ones after it, in
order, with the same policy and health store; the entries before it are not
tried. Leaving ``model`` out (or naming the primary) uses the whole chain. Any
other value raises `ValueError` listing the chain: a model is never silently
ignored, and a request never goes to a model the policy does not declare.

``models.list()`` answers from the chain itself (no network I/O): the chain is
the set of models a call through the gate can reach.
"""

from __future__ import annotations

from typing import Any

from openai.types import Model

from ...fsm import Policy, Target
from .http.timeouts import given

__all__ = ["Chains", "describe", "model_objects"]


def _names(t: Target) -> tuple[str, str, str]:
    return (t.name, t.model, f"{t.provider}/{t.model}")


def describe(policy: Policy) -> str:
    """``primary 'glm-5.1' (zai/glm-5.1), fallback_1 'glm-4.7' (zai/glm-4.7)``."""
    return ", ".join(f"{t.name} {t.model!r} ({t.provider}/{t.model})" for t in policy.targets)


def model_objects(policy: Policy) -> list[Model]:
    """The chain's models as the SDK's `Model` objects, in chain order."""
    return [
        Model(id=t.model, object="model", created=0, owned_by=t.provider) for t in policy.targets
    ]


class Chains:
    """The policy's chain, and where a call's ``model=`` starts it (a turn's `first`)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        #: Each name an entry answers to -> the first entry (in chain order) that does.
        self._first: dict[str, int] = {}
        starts: dict[str, int] = {}  # a group's first member: the entry's place
        for t in policy.targets:
            at = starts.setdefault(t.group, t.index) if t.group is not None else t.index
            for name in _names(t):
                self._first.setdefault(name, at)

    def index(self, model: Any) -> int:
        """Where ``model=`` starts the chain (0 when not given)."""
        if model is None or not given(model):
            return 0
        if isinstance(model, str) and model in self._first:
            return self._first[model]
        raise ValueError(
            f"model={model!r} is not in this gate's chain; name one of its entries "
            f"(model, provider/model or target name) to start the chain there, or leave "
            f"model out to use the whole chain: {describe(self.policy)}"
        )

    def model(self, name: Any) -> Model:
        """One entry's `Model` (``models.retrieve``), without network I/O."""
        return model_objects(self.policy)[self.index(name)]
