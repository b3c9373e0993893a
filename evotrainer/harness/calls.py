"""The one job every harness worker runs, for training, the backtest and the audit alike.

A harness must not be able to tell a replay from live training (docs/design.md, "The audit"):
a reward that behaved only when it thought it was replayed would pass every backtest and pay
something else in training. So there is one worker kind and one call protocol. Every sandbox
worker that loads harness code runs `HarnessJob` (the same module, so the same imports), and
the scoring of rollouts is one message kind, `("groups", frozen groups)`, answered by the same
code whoever sends it: the trainer once per GRPO step (train/recorder.py), the backtest once per
chunk (backtest/passes.py), the audit once per sampled step (train/audit.py). For each group,
in order: reward(), keep_rollout() and stop() (after every assistant turn) per rollout, the
counterfactual reward of each verified failure rescored as a success, keep_group(), and for
the first group of a message and a hashed sample of the others, all of it again. The reply:

    {"ids": [...], "rewards": [{component: float}], "keep": [bool], "cut": [bool],
     "keep_group": [bool per group], "counterfactual": [{component: float} or None]}

A frozen rollout is one plain list (`frozen_row`; backtest/rows.py reads the same layout from the
store): what the trainer knew when it scored the rollout, never what it learnt later
(`SCORED_LATER`, the loss's per-row means and step labels, are left out on both sides).
`("weights", task rows)` asks the curriculum, `{"weights": {...}}` back. The other kinds
(describe, render, stop, reward, filters, probe) serve the trusted side's other calls
(harness/isolated.py) and go to a worker of their own, never to one that scores.

Hiding is not the defence, only a courtesy to honest code: harness code can still read the
clock, count its calls or draw random numbers. What catches a harness that behaves differently
when replayed is the audit, which replays a sample of every training step in a fresh worker and
compares (train/audit.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from types import FrameType

from evotrainer.api import Outcome, Rollout, TaskStats, Turn, rollout_from_dict
from evotrainer.harness.loader import HarnessError
from evotrainer.harness.sandbox_failures import CandidateFailure
from evotrainer.harness.sandbox_worker import SandboxedHarness


def _loads_list(text: str) -> list:
    return [] if text == "[]" else json.loads(text)


def _build(group: list[list]) -> tuple[list[Rollout], list[tuple[Turn, ...]]]:
    """Fresh api objects for one frozen group, and each rollout's trajectory for stop()."""
    flat: dict[str, dict] = {}  # flat meta holds only immutable values: one parsed copy will do
    rollouts, trajectories = [], []
    for (rid, task_id, group_id, domain, prompt, completion, turns_text, success, score, kind,
         flags_text, tokens, truncated, meta_text) in group:
        turns = tuple(Turn(t["role"], t["content"]) for t in _loads_list(turns_text))
        outcome = Outcome(success, score, kind, tuple(_loads_list(flags_text)))
        if meta_text.count("{") > 1 or "[" in meta_text:  # nested: a copy of its own per rollout
            meta = json.loads(meta_text)
        else:
            meta = flat.get(meta_text)
            if meta is None:
                meta = flat[meta_text] = json.loads(meta_text)
        rollouts.append(Rollout(id=rid, task_id=task_id, group_id=group_id, domain=domain, prompt=prompt,
                                completion=completion, turns=turns, outcome=outcome, num_tokens=tokens,
                                truncated=truncated, meta=meta))
        trajectories.append(turns or (Turn("user", prompt), Turn("assistant", completion)))
    return rollouts, trajectories


def _cut(h: SandboxedHarness, trajectory: tuple[Turn, ...]) -> bool:
    """Whether the harness's stop() would have cut this trajectory: it is asked after every
    assistant turn (the last included, where a single-turn rollout is asked once)."""
    for i, turn in enumerate(trajectory):
        if turn.role == "assistant" and h.stop(trajectory[:i + 1]) is not None:
            return True
    return False


def _forget_the_parent() -> None:
    """multiprocessing hands every worker its parent's argv and working directory (the spawn
    preparation data, still held by a frame below us), and the fork server's import cache is
    keyed by the directory it started in: harness code would learn where the workspace is."""
    import multiprocessing.process

    frame: FrameType | None = sys._getframe()
    while frame is not None:
        data = frame.f_locals.get("preparation_data") if frame.f_code.co_name == "_main" else None
        if isinstance(data, dict):
            data.clear()
        frame = frame.f_back
    multiprocessing.process.ORIGINAL_DIR = os.getcwd()  # type: ignore[attr-defined]  # real, not in typeshed
    sys.argv[:] = ["evotrainer-sandbox"]
    # sys.path stays: our own code is imported through it. With `python -m` run inside the
    # workspace it holds the workspace, and so does the fork server's command line: that is
    # for the OS boundary to close (workers not started by multiprocessing).
    # Finders of a '' entry are cached under the directory the fork server started in. Dropped
    # alone: clearing the whole cache makes later imports redo work the guard refuses.
    entries = [os.path.abspath(p) for p in sys.path if p]
    for key in list(sys.path_importer_cache):
        if isinstance(key, str) and not any(key == e or key.startswith(e + os.sep) for e in entries):
            del sys.path_importer_cache[key]



# Meta keys the trainer adds to a rollout after its harness scored it (train/sample_stats.py: the
# loss's per-row means; train/grpo.py: step labels). A replay must not show them: the reward never
# saw them in training, and their presence alone would tell a harness it is being replayed.
SCORED_LATER = ("mean_logprob", "entropy", "kl", "step_labels")


def scored_meta(meta: Mapping) -> dict:
    """A stored rollout's meta as the harness saw it when it was scored."""
    return {k: v for k, v in meta.items() if k not in SCORED_LATER}


def frozen_row(rollout: Rollout) -> list:
    """One rollout as the plain list a scoring message carries (backtest/rows.py: the same layout)."""
    o = rollout.outcome
    return [rollout.id, rollout.task_id, rollout.group_id, rollout.domain, rollout.prompt, rollout.completion,
            json.dumps([{"role": t.role, "content": t.content} for t in rollout.turns]), bool(o.success),
            float(o.score), o.kind, json.dumps(list(o.flags)), int(rollout.num_tokens), bool(rollout.truncated),
            json.dumps(scored_meta(rollout.meta))]


def _refused(h: SandboxedHarness, what: str) -> None:
    """A refused operation that harness code swallowed, for calls made outside
    SandboxedHarness's own wrapper (probes, the template): the worker's guard recorded it."""
    violations = getattr(getattr(h, "_guard", None), "violations", ())
    if violations:
        raise CandidateFailure(f"{what} attempted {violations[0]}", h.label)


@dataclass(frozen=True)
class HarnessJob:
    """What any harness worker does with a message. Plain data only: it travels to the worker.
    `determinism_sample`: the share of groups of a scoring message scored twice (config gate)."""

    determinism_sample: float = 0.02

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> None:
        _forget_the_parent()  # before any harness code; nothing to open: the parent sends the data

    def calls(self, message: tuple) -> int | None:
        """At most how many harness calls `run` makes for this message: the parent's deadline for
        it is that many per-call budgets (SandboxPool._budget), whatever the worker reports. A
        scoring row costs reward, keep_rollout, a counterfactual reward and stop() after each
        assistant turn, all twice where the determinism check reruns it; keep_group twice a group."""
        kind = message[0]
        if kind == "groups":
            return sum(2 + sum(2 * (3 + max(1, str(row[6]).count('"assistant"'))) for row in group)
                       for group in message[1])
        if kind == "reward":
            return len(message[1])
        if kind == "filters":
            return sum(1 + len(dicts) for dicts, _ in message[1])
        return 1  # describe, weights, stop, probe: one call (describe reads attributes only)

    def run(self, state: None, harnesses: Mapping[str, SandboxedHarness], message: tuple) -> object:
        if len(harnesses) != 1:
            raise RuntimeError(f"a harness worker holds one harness, got {len(harnesses)}")
        (h,) = harnesses.values()
        kind = message[0]
        if kind == "groups":
            return self._groups(h, message[1])
        if kind == "weights":
            return {"weights": h.weights(tuple(TaskStats(*row) for row in message[1]))}
        return _other(h, message)

    def _groups(self, h: SandboxedHarness, groups: Sequence[list[list]]) -> dict:
        out: dict[str, list] = {"ids": [], "rewards": [], "keep": [], "cut": [], "keep_group": [],
                                "counterfactual": []}
        threshold = int(self.determinism_sample * 2**32)
        for n, group in enumerate(groups):
            check = n == 0 or zlib.crc32(group[0][2].encode()) < threshold  # and the first of each message
            _replay_group(h, group, check, out)
        return out


def _other(h: SandboxedHarness, message: tuple) -> object:
    """The trusted side's calls that are not scoring (harness/isolated.py)."""
    kind = message[0]
    if kind == "describe":
        inner = h.harness  # attributes of the loaded modules: data, no harness call
        return {"prompt": inner.prompt_source,
                "probes": [{"name": p.name, "dimension": p.dimension, "warn": p.warn,
                            "critical": p.critical, "direction": p.direction} for p in inner.probes]}
    if kind == "reward":
        return [h.reward(rollout_from_dict(d)) for d in message[1]]
    if kind == "filters":  # [(rollouts, rewards)] per group -> [(keep_group, [keep_rollout])]
        out = []
        for dicts, rewards in message[1]:
            rollouts = [rollout_from_dict(d) for d in dicts]
            group = h.keep_group(rollouts, rewards)
            out.append([group, [group and h.keep_rollout(r) for r in rollouts]])
        return out
    if kind == "stop":
        return h.stop([Turn(role, content) for role, content in message[1]])
    if kind == "probe":
        _, name, dicts, rewards = message
        probe = next(p for p in h.harness.probes if p.name == name)
        try:
            value: object = ["value", probe.evaluate([rollout_from_dict(d) for d in dicts], rewards)]
        except HarnessError as exc:  # the probe's own fault: that probe is n/a, as in process
            value = ["error", str(exc)[:2000]]
        _refused(h, f"diagnostics.py: probe {name}()")
        return value
    raise ValueError(f"unknown harness request {kind!r}")


def _replay_group(h: SandboxedHarness, group: list[list], check: bool, out: dict[str, list]) -> None:
    rollouts, trajectories = _build(group)
    current: str | None = rollouts[0].id
    try:
        comps, keeps, cuts, rewards = [], [], [], []
        for rollout, trajectory in zip(rollouts, trajectories):
            current = rollout.id
            comps.append(h.reward(rollout))
            rewards.append(h.training_reward(comps[-1]))  # what keep_group sees; the parent recomputes it
            if not math.isfinite(rewards[-1]):
                raise CandidateFailure(f"the training reward (weighted sum of {comps[-1]}) is {rewards[-1]}", h.label)
            keeps.append(h.keep_rollout(rollout))
            cuts.append(_cut(h, trajectory))
        # Rescored from fresh objects built from the frozen rows (harness code may have changed
        # the ones it was given), which rows are failures read off those rows too, and under an
        # id of their own: a reward that remembers ids answers for the rollout it is shown.
        counterfactual: list[dict[str, float] | None] = []
        for row, fresh in zip(group, _build(group)[0]):
            current = fresh.id
            if row[7]:  # the frozen row's verified success
                counterfactual.append(None)
            else:
                won = replace(fresh, id=f"{fresh.id}~as-success",
                              outcome=Outcome(True, 1.0, "ok", fresh.outcome.flags))
                counterfactual.append(h.reward(won))
        current = None
        keep_group = h.keep_group(rollouts, rewards)
        if check:
            for i, (rollout, trajectory) in enumerate(zip(rollouts, trajectories)):
                current = rollout.id
                again = (h.reward(rollout), h.keep_rollout(rollout), _cut(h, trajectory))
                first = (comps[i], keeps[i], cuts[i])
                if again != first:
                    what = ("reward()", "keep_rollout()", "stop()")[[a == b for a, b in zip(again, first)].index(False)]
                    raise CandidateFailure(f"not deterministic: {what} gave a different result when "
                                           "the same rollout was scored twice", h.label)
            current = None
            if h.keep_group(rollouts, rewards) != keep_group:
                raise CandidateFailure("not deterministic: keep_group() gave a different result when "
                                       "the same group was scored twice", h.label)
    except CandidateFailure as failure:
        where = f"rollout {current}" if current else f"group {rollouts[0].group_id}"
        raise CandidateFailure(f"{failure.reason} (on {where})", failure.harness) from None
    out["ids"] += [r.id for r in rollouts]
    out["rewards"] += comps
    out["keep"] += keeps
    out["cut"] += cuts
    out["keep_group"].append(keep_group)
    out["counterfactual"] += counterfactual


class _InProcess:
    """A harness loaded in this process (tests, a user's own script) in the shape the job calls."""

    label = "harness"

    def __init__(self, harness: object):
        self.harness = harness

    def __getattr__(self, name: str) -> object:
        return getattr(self.harness, name)


def score_in_process(harness: object, groups: Sequence[list[list]], determinism_sample: float = 0.02) -> dict:
    """The scoring reply of a harness loaded in this process, from the very same code a worker runs."""
    try:
        return HarnessJob(determinism_sample)._groups(_InProcess(harness), groups)  # type: ignore[arg-type]
    except CandidateFailure as failure:
        raise HarnessError(failure.reason) from None


__all__ = ["SCORED_LATER", "HarnessJob", "frozen_row", "score_in_process", "scored_meta"]
