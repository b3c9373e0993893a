"""TRL: a user's own `GRPOTrainer` writes its rollouts into a workspace store; the harness as its reward.

**In.** `StoreRollouts` is a `transformers.TrainerCallback`. TRL hands a callback no completions,
only the trainer's logged statistics, so the callback also wraps the reward functions the user
passes (`watch`): each wrapped function returns what the user's function returns and records it
by its name beside the batch's prompts and completions. At the end of every step the step's
rollouts are stored as rows of one round of the run (made on the first step), each with every
reward function's value as a reward component and TRL's weighted sum as its reward; TRL's logged
statistics (`on_log`) go into the round's metrics under `trl_log`.

    rec = StoreRollouts("evotrainer-work", domain="math", answer_column="answer")
    trainer = GRPOTrainer(model, reward_funcs=rec.watch([accuracy, fmt]), args=args,
                          train_dataset=ds, callbacks=[rec])

The outcome: the domain rechecks each completion against the dataset's `answer_column`, or with
`outcome_field=NAME` the named reward function's 0/1 value is the outcome, stored as
source-reported (integrations/imported.py).

**Out.** `harness_rewards(workdir, rev)` is a list of TRL reward functions: one, the harness's
training reward (reward.py's components weighted by harness.yaml's `reward_weights`, each
component also logged as a TRL metric), computed after the domain's check, in a sandbox worker.
With `filters=True` (the default) filters.py acts too: TRL has no hook that drops a rollout from
the loss, so a rollout keep_rollout or keep_group drops gets the mean reward of its group's kept
rollouts, which gives it an advantage of exactly zero (a dropped group: all equal, all zero).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from evotrainer.integrations.imported import (
    OutcomePolicy,
    Record,
    Target,
    add_converted,
    as_text,
    convert_records,
    open_round,
)

SOURCE = "trl"


class _Batch:
    """One generation batch, as the reward functions saw it."""

    def __init__(self, step: int, prompts: list, completions: list, answers: list[Any] | None):
        self.step, self.prompts, self.completions, self.answers = step, prompts, completions, answers
        self.rewards: dict[str, list[float]] = {}


class StoreRollouts(TrainerCallback):
    """Stores a GRPOTrainer's rollouts, step by step, as one round of `run` in a workspace store."""

    def __init__(self, workdir: Path | str, *, domain: str, run: str = SOURCE, answer_column: str = "answer",
                 outcome_field: str | None = None, weights: Sequence[float] | None = None):
        from evotrainer.workspace import ensure_workspace

        self.workdir = Path(workdir)
        ensure_workspace(self.workdir, domain)
        self.run, self.answer_column = run, answer_column
        self.policy = OutcomePolicy(domain, outcome_field)
        self.weights = list(weights) if weights is not None else None  # TRL's reward_weights
        self.names: list[str] = []
        self.pending: dict[int, _Batch] = {}  # by id() of the completions list TRL hands every function
        self.logs: list[dict[str, Any]] = []
        self.target: Target | None = None
        self.stored = 0

    # ------------------------------------------------------------------ the reward functions

    def watch(self, reward_funcs: Sequence[Callable[..., Any]]) -> list[Callable[..., Any]]:
        """The user's reward functions, each recording its values (TRL names them by __name__)."""
        wrapped = []
        for fn in reward_funcs:
            if not callable(fn) or not hasattr(fn, "__name__"):
                raise TypeError("StoreRollouts.watch takes plain reward functions (a reward model is not recorded)")
            self.names.append(fn.__name__)
            wrapped.append(self._wrap(fn))
        return wrapped

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def recorded(prompts: list, completions: list, **kwargs: Any) -> list:
            values = fn(prompts=prompts, completions=completions, **kwargs)
            state = kwargs.get("trainer_state")
            batch = self.pending.get(id(completions))
            if batch is None:
                batch = self.pending[id(completions)] = _Batch(
                    int(getattr(state, "global_step", 0)), list(prompts), list(completions),
                    kwargs.get(self.answer_column))
            batch.rewards[fn.__name__] = [math.nan if v is None else float(v) for v in values]
            return values

        return recorded

    # ------------------------------------------------------------------ the callback

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items()
                                                          if isinstance(v, (int, float, str, bool)) or v is None}})
            self._flush(final=False)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._flush(final=False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._flush(final=True)

    def _records(self, batch: _Batch, n: int) -> list[Record]:
        weights = self.weights or [1.0] * len(self.names)
        out = []
        for i, (prompt, completion) in enumerate(zip(batch.prompts, batch.completions)):
            comps = {name: batch.rewards[name][i] for name in self.names if name in batch.rewards}
            finite = {k: v for k, v in comps.items() if math.isfinite(v)}
            score = sum(w * finite[name] for w, name in zip(weights, self.names) if name in finite)
            answer = batch.answers[i] if batch.answers is not None else None
            out.append(Record(where=f"trl step {batch.step}", line=n + i + 1, step=batch.step,
                              prompt=as_text(prompt), completion=as_text(completion),
                              answer=None if answer is None else str(answer), score=score, group=None,
                              fields={"rewards": comps}, components=finite))
        return out

    def _flush(self, final: bool) -> None:
        from evotrainer.store import Store

        with Store.open(self.workdir) as store:
            for key, batch in list(self.pending.items()):
                if len(batch.rewards) < len(self.names) and not final:
                    continue  # a reward function of this batch has not run yet
                del self.pending[key]
                records = self._records(batch, self.stored)
                if self.policy.field:
                    records = [_with_field(r, self.policy.field) for r in records]
                done = convert_records(SOURCE, records, run=self.run, policy=self.policy)
                if self.target is None:
                    self.target = open_round(store, SOURCE, self.run, self.policy)
                self.stored += add_converted(store, done, self.target)
            if self.target is not None and self.logs:
                store.merge_round_metrics(self.target.round_id, {"trl_log": self.logs})
            if final and self.target is not None:
                store.merge_round_metrics(self.target.round_id, {"trl_rollouts": self.stored})


def _with_field(rec: Record, name: str) -> Record:
    """The named reward function's value as the field --outcome-field reads."""
    from dataclasses import replace

    value = rec.components.get(name)
    return replace(rec, fields={**rec.fields, name: value if value is None else float(value)})


# ---------------------------------------------------------------------- out


def harness_rewards(workdir: Path | str, rev: str = "main", *, answer_column: str = "answer",
                    filters: bool = True) -> list[Callable[..., list[float]]]:
    """TRL reward functions for the harness at `rev` of the workspace at `workdir`."""
    from evotrainer.integrations.scoring import HarnessScorer

    scorer = HarnessScorer.from_workspace(workdir, rev)

    def harness(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        answers = kwargs.get(answer_column) or [None] * len(completions)
        texts, outs = [as_text(p) for p in prompts], [as_text(c) for c in completions]
        scored = scorer.score(texts, outs, answers)
        rewards = [s.reward for s in scored]
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for name in sorted({k for s in scored for k in s.components}):
                log_metric(f"harness/{name}", sum(s.components.get(name, 0.0) for s in scored) / len(scored))
        if filters:
            rollouts = scorer.rollouts(texts, outs, answers, groups=texts)
            kept = scorer.keep(rollouts, rewards)
            rewards = neutralise(rewards, kept, texts)
            if log_metric is not None:
                log_metric("harness/kept_fraction", sum(kept) / len(kept))
        return rewards

    harness.__name__ = f"harness_{scorer.commit[:12]}"
    harness.harness_commit = scorer.commit  # type: ignore[attr-defined]  # the commit it came from
    harness.scorer = scorer  # type: ignore[attr-defined]  # close() stops its sandbox worker
    return [harness]


def neutralise(rewards: Sequence[float], kept: Sequence[bool], groups: Sequence[str]) -> list[float]:
    """Each dropped rollout's reward set to the mean of its group's kept ones (every member's when
    none is kept): its group-relative advantage is then exactly zero, whatever the scaling."""
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = list(rewards)
    for idx in members.values():
        keep = [i for i in idx if kept[i]]
        base = keep or idx
        mean = sum(rewards[i] for i in base) / len(base)
        for i in idx:
            if not kept[i] or not keep:
                out[i] = mean
    return out
