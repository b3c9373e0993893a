"""Turns each sampled completion into a scored Rollout, and stores it once its advantage is known.

The recorder is the reward function TRL calls. It runs the trusted check (verified outcome),
then the harness reward (named components), and keeps the scored rollouts of the current
generation batch until the trainer hook has computed advantages and filter decisions, and then
until the loss's forward pass has measured each one (train/sample_stats.py): `commit` stores the
batch before the backward pass. A step's harness calls go out as one scoring message of whole
groups (harness/calls.py): reward, keep flags and stop cuts of every rollout in one round trip
to the scoring worker, the very message and job a backtest sends, so a harness cannot tell the
two apart. With `audit_groups` > 0, a sample of each stored step is replayed in a fresh worker
and compared (train/audit.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from evotrainer.api import Rollout
from evotrainer.backtest.rows import Fact
from evotrainer.backtest.scoring import check_values
from evotrainer.domains.base import Domain, Task
from evotrainer.harness.calls import frozen_row, score_in_process
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness, HarnessError, validate_reward
from evotrainer.harness.sandbox import CandidateFailure
from evotrainer.store import Store, StoredRollout
from evotrainer.train.audit import AuditFailure, StepAudit, group_values


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
                 ctx: RoundContext, stop_token_ids: Sequence[int], group_size: int | None = None,
                 audit_groups: int = 0):
        """`group_size`: completions per prompt (harness.yaml num_generations when None);
        `audit_groups`: groups of each step replayed by the audit (config train.audit_groups)."""
        self.domain = domain
        self.tasks = tasks
        self.harness = harness
        self.store = store
        self.ctx = ctx
        self.stop_token_ids = set(stop_token_ids)
        self.pending: list[tuple[Rollout, dict[str, float], float]] = []
        self.unstored: list[StoredRollout] | None = None  # filtered and scored, waiting for commit()
        self.step = 0
        self.group_size = int(group_size or harness.spec.grpo["num_generations"])
        self.audit = StepAudit(harness, audit_groups)
        self._scores: list[dict[str, Any]] = []  # this step's values per group, as the scoring worker sent them
        self._unstored_scores: list[dict[str, Any]] = []

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
        self.audit.finish()  # the last step's audit found a difference: stop before this step trains
        groups = []
        for start in range(0, n, self.group_size):  # TRL lays each prompt's completions out together
            group_id = uuid.uuid4().hex
            groups.append([replace(r, group_id=group_id) for r in scored[start:start + self.group_size]])
        self._scores = self._score(groups)
        for group, values in zip(groups, self._scores):
            for rollout, components in zip(group, values["rewards"]):
                reward = self.harness.training_reward(components)
                self.pending.append((rollout, components, reward))
                rewards.append(reward)
        return rewards

    def _score(self, groups: list[list[Rollout]]) -> list[dict[str, Any]]:
        """The harness's values for the step's groups, per group: one scoring message (harness/calls.py)."""
        frozen = [[frozen_row(r) for r in group] for group in groups]
        score = getattr(self.harness, "score", None)
        try:
            reply = score(frozen) if score is not None else score_in_process(self.harness, frozen)
        except HarnessError as exc:
            if "not deterministic" in str(exc):  # the job's own rerun (harness/calls.py) disagreed
                raise AuditFailure(getattr(self.harness, "version", self.ctx.harness_version), self.step,
                                   str(exc)) from None
            raise
        facts = [[Fact(r.id, r.group_id, r.task_id, r.outcome.success, False, r.num_tokens) for r in group]
                 for group in groups]
        try:
            check_values("harness", reply, facts)  # the backtest's own check of a worker's reply
        except CandidateFailure as failure:
            raise HarnessError(f"harness {self.ctx.harness_version[:12]}: {failure.reason}") from None
        reply["rewards"] = [validate_reward(c) for c in reply["rewards"]]
        return group_values(reply, [len(g) for g in groups])

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
        """Apply the harness's keep flags (scored with the rewards) and return the kept mask. The scored batch waits in
        `unstored` until `commit` (the trainer commits it once its loss has measured each rollout)."""
        if len(advantages) != len(self.pending):
            raise RuntimeError(f"{len(advantages)} advantages for {len(self.pending)} rollouts")
        if self.unstored is not None:  # a batch no loss pass saw is stored as it is
            self.commit()
        if len(self.pending) != sum(len(v["ids"]) for v in self._scores) or group_size != self.group_size:
            raise RuntimeError(f"groups of {group_size} finalized for a batch scored in groups of {self.group_size}")
        kept: list[bool] = []
        rows: list[StoredRollout] = []
        for (rollout, components, reward), advantage, keep in zip(
                self.pending, advantages,
                (v["keep_group"] and k for v in self._scores for k in v["keep"])):
            kept.append(keep)
            rows.append(StoredRollout(
                rollout=rollout, reward_components=components, reward=reward,
                advantage=float(advantage), kept=keep,
                model_version=f"{self.ctx.model_version}+s{self.step}",
                seed=self.ctx.seed, harness_version=self.ctx.harness_version,
                run_id=self.ctx.run_id, round_id=self.ctx.round_id, step=self.step,
            ))
        self._unstored_scores, self._scores = self._scores, []
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
        # Audited as stored: the rows a backtest would read, against the values training used.
        sizes = [len(v["ids"]) for v in self._unstored_scores]
        starts = [sum(sizes[:g]) for g in range(len(sizes))]
        self.audit.submit(rows[0].step if rows else self.step,
                          [[frozen_row(row.rollout) for row in rows[a:a + n]] for a, n in zip(starts, sizes)],
                          self._unstored_scores)
        self._unstored_scores = []
