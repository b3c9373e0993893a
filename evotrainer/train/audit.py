"""The audit: a sample of every training step's groups replayed in a fresh worker, and compared.

A harness is a deterministic function of a rollout: the backtest that promoted it, every
replay since and the trainer must get the same rewards, keep flags and stop cuts from it.
Hiding which job loaded a harness (harness/calls.py: one worker kind, one call protocol)
makes that easy for honest code, but harness code can still read the clock, count its calls or
draw random numbers. So training checks instead of trusting: after each step's batch is stored,
`StepAudit` draws `train.audit_groups` of its groups (with the operating system's randomness,
after the values are fixed, so no harness can know which), sends them, built from the stored
rows exactly as the backtest reads them (backtest/rows.py), to a fresh sandbox worker running
the backtest's own job (the round's curriculum call first, as training's scoring worker got it),
and compares its raw reply with the values training used, bit for bit.

Any difference (or a replay that fails where training did not) is an `AuditFailure`: a
HarnessError that names the harness commit, the step and the first rollout that differs. It is
evidence of a sleeper (a harness that behaves differently when it thinks it is replayed) or of
nondeterminism, and both are disqualifying: the round stops before its adapter is saved, and
coevolve reverts the promotion that brought the harness in (coevolve/loop.py) or rejects a
pilot's candidate (coevolve/pilot.py).

The replay runs on a thread beside training (the worker's start and the replay overlap the
next step's generation); its verdict is awaited before the next step is scored and at the
end of the round (`finish`), so a bad first step stops the round before a second one trains.
The job's own rerun of a message's first group (harness/calls.py) is part of the same check:
a reward that differs when scored twice in training is an AuditFailure too.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evotrainer.harness.calls import HarnessJob
from evotrainer.harness.errors import HarnessError
from evotrainer.harness.sandbox import CandidateFailure, SandboxPool

KEYS = ("rewards", "keep", "cut", "counterfactual")  # per rollout; keep_group is per group
_WHAT = {"rewards": "reward()", "keep": "keep_rollout()", "cut": "stop()",
         "counterfactual": "reward() of the failure rescored as a success", "keep_group": "keep_group()"}


class AuditFailure(HarnessError):
    """Training's harness values differ from a fresh replay of the same rollouts."""

    def __init__(self, version: str, step: int, detail: str):
        self.version, self.step, self.detail = version, step, detail
        super().__init__(f"audit: harness {version[:12]} gave training values that a fresh replay worker does not "
                         f"reproduce (step {step}: {detail}). A harness must be a deterministic function of a "
                         "rollout; a difference means it behaves differently when replayed (a sleeper) or is "
                         "nondeterministic, and either disqualifies it")


@dataclass(frozen=True)
class _Sample:
    step: int
    groups: list[list[list]]  # frozen rows, as the backtest reads them
    values: list[dict[str, Any]]  # training's reply per group: {key: [per rollout]}, keep_group


def group_values(reply: Mapping[str, list], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """A scoring reply split per group: {"ids", KEYS..., "keep_group"} for each."""
    out, at = [], 0
    for g, size in enumerate(sizes):
        part = {key: list(reply[key][at:at + size]) for key in ("ids", *KEYS)}
        part["keep_group"] = reply["keep_group"][g]
        out.append(part)
        at += size
    return out


def difference(trained: Sequence[Mapping[str, Any]], replayed: Sequence[Mapping[str, Any]]) -> str | None:
    """The first value that differs, described; None when the replay reproduced every one."""
    for t, r in zip(trained, replayed):
        for key in KEYS:
            for rid, a, b in zip(t["ids"], t[key], r[key]):
                if a != b:
                    return f"{_WHAT[key]} of rollout {rid} was {a!r} in training, {b!r} when replayed"
        if t["keep_group"] != r["keep_group"]:
            return (f"{_WHAT['keep_group']} of the group of rollout {t['ids'][0]} was {t['keep_group']!r} "
                    f"in training, {r['keep_group']!r} when replayed")
    return None


class StepAudit:
    """Audits the steps of one round of one harness (an IsolatedHarness: its sources and limits)."""

    def __init__(self, harness: Any, groups_per_step: int):
        self.harness, self.groups_per_step = harness, int(groups_per_step)
        self._threads: list[threading.Thread] = []
        self._failure: AuditFailure | None = None
        self._lock = threading.Lock()
        self._random = random.SystemRandom()
        self.audited = 0  # rollouts replayed so far

    @property
    def enabled(self) -> bool:
        return self.groups_per_step > 0 and hasattr(self.harness, "sources")

    def submit(self, step: int, groups: Sequence[list[list]], values: Sequence[Mapping[str, Any]]) -> None:
        """Audit a sample of this step's `groups` (frozen rows) against `values` (training's, per group)."""
        if not self.enabled or not groups:
            return
        # In reverse order of training, in a fresh worker: a reward that keys on how many calls
        # its process has answered sees other counts for the same rollouts.
        picks = sorted(self._random.sample(range(len(groups)), min(self.groups_per_step, len(groups))), reverse=True)
        sample = _Sample(step, [list(groups[i]) for i in picks], [dict(values[i]) for i in picks])
        thread = threading.Thread(target=self._replay, args=(sample,), name="evotrainer-audit", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _replay(self, sample: _Sample) -> None:
        h = self.harness
        job = HarnessJob(getattr(getattr(h, "job", None), "determinism_sample", 0.02))
        detail = None
        try:
            # A fresh worker, asked what training's scoring worker was asked: the round's curriculum
            # call first (as a backtest of one round asks for its task history's weights), then the
            # groups. A harness that keys on which calls its process got sees the same ones.
            rows = getattr(h, "curriculum_rows", None)
            messages = ([("weights", rows)] if rows is not None else []) + [("groups", sample.groups)]
            with SandboxPool([("harness", h.sources)], job, 1, h.limits) as pool:
                reply = [reply for _, reply in pool.imap(messages)][-1]
            replayed = group_values(reply, [len(g) for g in sample.groups])
            detail = difference(sample.values, replayed)
        except CandidateFailure as failure:
            detail = f"the replay failed where training did not: {failure.reason}"
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            detail = f"the replay's reply is malformed ({type(exc).__name__})"
        with self._lock:
            self.audited += sum(map(len, sample.groups))
            if detail is not None and self._failure is None:
                self._failure = AuditFailure(h.version, sample.step, detail)

    def check(self) -> None:
        """Raise the first difference found by the audits that have finished."""
        self._threads = [t for t in self._threads if t.is_alive()]
        with self._lock:
            if self._failure is not None:
                raise self._failure

    def finish(self) -> None:
        """Wait for every audit in flight, then `check`."""
        for thread in self._threads:
            thread.join()
        self.check()


__all__ = ["AuditFailure", "StepAudit", "difference", "group_values"]
