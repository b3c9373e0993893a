"""Inside one sandbox worker: replay one harness version over frozen rollouts, return raw values.

The worker holds one harness, never two (base and candidate never share a process) and nothing
else: no store, no URL, no path. Each message carries frozen rollouts as plain data (rows.py);
the worker builds fresh `evotrainer.api` objects from them, calls the harness, and sends back
only what the harness decided, per rollout in the order sent:

    {"ids": [...], "rewards": [{component: float}], "keep": [bool], "cut": [bool],
     "keep_group": [bool per group], "counterfactual": [{component: float} or None]}

`counterfactual` holds, for each verified failure, the reward of the same rollout rescored as a
verified success (outcome success, score 1, kind "ok", its flags kept), None for a success: what
the reward would pay a success in that group (metrics.py, counterfactual_violations).

or, for the curriculum, {"weights": {task_id: float}}. The parent checks every value and joins
them with the verified outcomes it kept (scoring.py); nothing here decides a metric. The
reruns below only give an honest nondeterministic harness a clear reason early; the check that
counts is the parent's rerun in a second, fresh worker (engine.py).
"""

from __future__ import annotations

import json
import math
import os
import sys
import zlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from types import FrameType

from evotrainer.api import Outcome, Rollout, TaskStats, Turn
from evotrainer.harness.sandbox import CandidateFailure, SandboxedHarness


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


@dataclass(frozen=True)
class ReplayJob:
    """What a replay worker does with a message. Plain data only: it travels to the worker."""

    determinism_sample: float = 0.02

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> None:
        _forget_the_parent()  # before any harness code; nothing to open: the parent sends the rows

    def run(self, state: None, harnesses: Mapping[str, SandboxedHarness], message: tuple) -> dict:
        if len(harnesses) != 1:
            raise RuntimeError(f"a replay worker holds one harness, got {len(harnesses)}")
        (h,) = harnesses.values()
        kind, payload = message
        if kind == "weights":
            return {"weights": h.weights(tuple(TaskStats(*row) for row in payload))}
        out: dict[str, list] = {"ids": [], "rewards": [], "keep": [], "cut": [], "keep_group": [],
                                "counterfactual": []}
        threshold = int(self.determinism_sample * 2**32)
        for n, group in enumerate(payload):
            check = n == 0 or zlib.crc32(group[0][2].encode()) < threshold  # and the first of each chunk
            _replay_group(h, group, check, out)
        return out


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


__all__ = ["ReplayJob"]
