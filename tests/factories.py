"""Rollouts and stored rows for tests, built by keyword with defaults for what a test does not care about.

A test names only the fields its assertions depend on; a field added to `evotrainer.api.Rollout`
or `StoredRollout` gets its default here, once, instead of in every test that builds one.

    make_rollout("r1", group_id="g", success=True)            # Outcome(True, 1.0, "ok", ())
    make_rollout(completion="Answer: 5", kind="wrong", flags=("answer_marker",), num_tokens=12)
    make_stored(make_rollout(), reward=1.0, kept=True, run_id=run, round_id=rnd)

tests/ is on sys.path for every test module (pytest's rootdir-relative import), so
`from factories import make_rollout` works from any of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from evotrainer.api import Outcome, Rollout, Turn
from evotrainer.store import StoredRollout


def make_outcome(success: bool = False, kind: str | None = None, flags: Iterable[str] = (),
                 score: float | None = None) -> Outcome:
    """An Outcome whose score follows its success and whose kind is "ok"/"wrong" unless given."""
    return Outcome(success, float(success) if score is None else score, kind or ("ok" if success else "wrong"),
                   tuple(flags))


def make_rollout(id: str = "r0", *, task_id: str | None = None, group_id: str = "g", domain: str = "math",
                 prompt: str = "What is 2 + 2?", completion: str = "Answer: 4",
                 turns: Iterable[Turn] = (), outcome: Outcome | None = None, success: bool = False,
                 kind: str | None = None, flags: Iterable[str] = (), score: float | None = None,
                 num_tokens: int = 4, truncated: bool = False, meta: Mapping[str, Any] | None = None) -> Rollout:
    """One Rollout. `outcome` wins over success/kind/flags/score; the task defaults to t-<group>."""
    if outcome is None:
        outcome = make_outcome(success, kind, flags, score)
    return Rollout(id=id, task_id=f"t-{group_id}" if task_id is None else task_id, group_id=group_id,
                   domain=domain, prompt=prompt, completion=completion, turns=tuple(turns), outcome=outcome,
                   num_tokens=num_tokens, truncated=truncated, meta=meta or {})


def make_stored(rollout: Rollout | None = None, *, reward: float | None = None,
                reward_components: dict[str, float] | None = None, **fields: Any) -> StoredRollout:
    """A stored row around `rollout` (a default one if None); the other StoredRollout fields by name.
    `reward_components` defaults to {"correct": reward} when a reward is given."""
    if reward_components is None:
        reward_components = {} if reward is None else {"correct": reward}
    return StoredRollout(rollout=rollout or make_rollout(), reward_components=reward_components, reward=reward,
                         **fields)


__all__ = ["make_outcome", "make_rollout", "make_stored"]
