"""Turns each sampled completion into a scored Rollout, and stores it once its advantage is known.

The recorder is the reward function TRL calls. It runs the trusted check (verified outcome),
then the harness reward (named components), and keeps the scored rollouts of the current
generation batch until the trainer hook has computed advantages and filter decisions, and then
until the loss's forward pass has measured each one (train/sample_stats.py): `commit` stores the
batch before the backward pass. Harness calls go out as one batch per step (rewards, then
filters): with an IsolatedHarness each batch is one round trip to its sandbox worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from evotrainer.api import Rollout
from evotrainer.domains.base import Domain, Task
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness
from evotrainer.store import Store, StoredRollout


def completion_text(completion: Any) -> str:
    """TRL passes conversational completions as message lists, plain ones as strings."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


@dataclass
class RoundContext:
    """What every rollout of one training round shares."""

    run_id: int
    round_id: int
    model_version: str
    harness_version: str
    seed: int


class RolloutRecorder:
    """Reward function for TRL plus the buffer that the trainer hook finalizes."""

    __name__ = "harness"  # TRL names reward functions by __name__ in its logs

    def __init__(self, domain: Domain, tasks: dict[str, Task], harness: IsolatedHarness | Harness, store: Store,
                 ctx: RoundContext, stop_token_ids: Sequence[int]):
        self.domain = domain
        self.tasks = tasks
        self.harness = harness
        self.store = store
        self.ctx = ctx
        self.stop_token_ids = set(stop_token_ids)
        self.pending: list[tuple[Rollout, dict[str, float], float]] = []
        self.unstored: list[StoredRollout] | None = None  # filtered and scored, waiting for commit()
        self.step = 0

    def __call__(self, prompts, completions, completion_ids, task_id, agent_rollout=None, experience=None,
                 **_: Any) -> list[float]:
        self.pending = []
        rewards: list[float] = []
        scored: list[Rollout] = []
        n = len(prompts)
        for i in range(n):
            if agent_rollout is not None:
                # Multi-turn (train/rollout.py): the episode's turns and its trusted outcome, graded
                # by the same grader when the episode ended.
                rollout = agent_rollout[i]
            else:
                rollout = self._single_turn(prompts[i], completions[i], completion_ids[i], task_id[i])
            if experience is not None and experience[i]:
                # Experience-guided (experience/inject.py): stored and rewarded with its clean
                # prompt; meta names the lessons the policy was shown.
                rollout = replace(rollout, prompt=completion_text(experience[i]["prompt"]),
                                  meta={**rollout.meta, "experience": list(experience[i]["lessons"])})
            scored.append(rollout)
        # One request for the whole batch: harness code runs in a sandbox worker (harness/isolated.py).
        for rollout, components in zip(scored, self.harness.rewards(scored)):
            reward = self.harness.training_reward(components)
            self.pending.append((rollout, components, reward))
            rewards.append(reward)
        return rewards

    def _single_turn(self, prompt, completion, ids, task_id: str) -> Rollout:
        task = self.tasks[task_id]
        truncated = not ids or ids[-1] not in self.stop_token_ids
        text = completion_text(completion)
        # A domain whose trusted check records more than the outcome (swe: the grader's per-test
        # results) says so through check_meta; that goes into the stored rollout's meta.
        check_meta = getattr(self.domain, "check_meta", None)
        outcome, extra = check_meta(task, text, truncated) if check_meta else (self.domain.check(task, text, truncated), {})
        return Rollout(
            id=uuid.uuid4().hex,
            task_id=task.task_id,
            group_id="",  # set in finalize, once groups are known
            domain=task.domain,
            prompt=completion_text(prompt),
            completion=text,
            turns=(),
            outcome=outcome,
            num_tokens=len(ids),
            truncated=truncated,
            meta={"level": task.level, "answer": task.answer, "split": task.split, **extra},
        )

    def finalize(self, advantages: Sequence[float], group_size: int) -> list[bool]:
        """Apply the harness filters and return the kept mask. The scored batch waits in
        `unstored` until `commit` (the trainer commits it once its loss has measured each rollout)."""
        if len(advantages) != len(self.pending):
            raise RuntimeError(f"{len(advantages)} advantages for {len(self.pending)} rollouts")
        if self.unstored is not None:  # a batch no loss pass saw is stored as it is
            self.commit()
        kept: list[bool] = []
        rows: list[StoredRollout] = []
        groups = []
        for start in range(0, len(self.pending), group_size):
            group = self.pending[start:start + group_size]
            group_id = uuid.uuid4().hex
            groups.append(([replace(r, group_id=group_id) for r, _, _ in group], [rw for _, _, rw in group]))
        decisions = self.harness.filters(groups)  # every group of the step in one request
        for g, ((rollouts, _), keeps) in enumerate(zip(groups, decisions)):
            start = g * group_size
            group = self.pending[start:start + group_size]
            for j, (rollout, (_, components, reward), keep) in enumerate(zip(rollouts, group, keeps)):
                kept.append(keep)
                rows.append(StoredRollout(
                    rollout=rollout, reward_components=components, reward=reward,
                    advantage=float(advantages[start + j]), kept=keep,
                    model_version=f"{self.ctx.model_version}+s{self.step}",
                    seed=self.ctx.seed, harness_version=self.ctx.harness_version,
                    run_id=self.ctx.run_id, round_id=self.ctx.round_id, step=self.step,
                ))
        self.last_batch = self.unstored = rows
        self.pending = []
        self.step += 1
        return kept

    def annotate(self, meta: Mapping[int, Mapping[str, Any]]) -> None:
        """Add meta keys to rows of the held batch before it is stored (row i gets meta[i])."""
        if self.unstored is None or not meta:
            return
        self.unstored = [replace(row, rollout=replace(row.rollout, meta={**row.rollout.meta, **meta[i]}))
                         if i in meta else row for i, row in enumerate(self.unstored)]
        self.last_batch = self.unstored

    def commit(self, model_state: Mapping[int, Mapping[str, float]] | None = None) -> None:
        """Store the held batch, rollout i's meta joined with model_state[i] (its means from the
        loss's forward pass, train/sample_stats.py)."""
        extra = model_state or {}
        rows = [replace(row, rollout=replace(row.rollout, meta={**row.rollout.meta, **extra[i]})) if i in extra
                else row for i, row in enumerate(self.unstored or [])]
        # Committed before the batch's loss is backpropagated: a kill after this line loses none
        # of these rollouts.
        self.store.add_rollouts(rows)
        self.last_batch, self.unstored = rows, None
