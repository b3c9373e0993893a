"""The trusted side's handle on a harness whose code runs only in a sandbox worker, called in batches.

Training, diagnose and the report never execute harness Python in their own process. They hold
an `IsolatedHarness`: harness.yaml is parsed here (it is data); every call into reward.py,
filters.py, curriculum.py, rollout.py's stop() and the probes is a message to a worker of a
`SandboxPool` (evotrainer/harness/sandbox.py). Prompts are not: the trusted side renders them
from rollout.py's PROMPT text in a worker that never loads harness code (harness/prompts.py), so
no harness code can write into a training, validation or held-out prompt. Every worker runs the
one harness job (harness/calls.py). Scoring (`score`: every reward, keep flag and stop cut of a
GRPO step in one message) and the curriculum go to a worker of their own that receives exactly
what a backtest worker receives, so a harness cannot tell training from a replay by its calls;
the rest (describe, the agent's live stop(), probes, diagnose's batched rewards and filters) to
another. The boundary costs one round trip per step, not one per rollout.

What comes back is JSON from a process that ran untrusted code: each value goes through the same
`validate_*` check here that the worker already applied. A harness fault (or a worker that died,
hung, or tried something the guards refuse) is a HarnessError naming the harness, as a fault of
an in-process Harness was; the pool is started again on the next call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evotrainer.api import Rollout, TaskStats, Turn, rollout_to_dict
from evotrainer.harness.calls import HarnessJob
from evotrainer.harness.loader import (
    SPEC_FILE,
    HarnessError,
    Probe,
    harness_version,
    parse_spec,
    prompt_template,
    validate_bool,
    validate_probes,
    validate_reward,
    validate_stop,
    validate_training_reward,
    validate_weights,
)
from evotrainer.harness.prompts import render_prompts
from evotrainer.harness.sandbox import CandidateFailure, SandboxLimits, SandboxPool

LABEL = "harness"


def _stats_row(s: TaskStats) -> list:
    """A curriculum's input as the backtest sends it (backtest/selector.py, history)."""
    return [s.task_id, s.attempts, s.successes, dict(s.meta)]


HarnessCalls = HarnessJob  # the one job of every harness worker (harness/calls.py)


class IsolatedHarness:
    """A harness by its sources; its code runs in a sandbox worker, started on first use."""

    def __init__(self, sources: Mapping[str, str], path: Path | str, version: str | None = None,
                 limits: SandboxLimits = SandboxLimits()) -> None:
        self.sources = dict(sources)
        self.path = Path(path)
        self.spec = parse_spec(self.sources[SPEC_FILE])  # data: safe to read here
        self.version = version or harness_version(self.sources)
        self.limits = limits
        self.job = HarnessJob()  # the loop sets the config's determinism sample before first use
        self._pools: dict[str, SandboxPool] = {}  # "calls" and "scoring" (see the module doc)
        self._described: dict | None = None
        self.curriculum_rows: list | None = None  # the scoring worker's last curriculum call
        self._closers: dict[str, weakref.finalize] = {}  # stop the workers when this is collected

    def __repr__(self) -> str:
        return f"IsolatedHarness({str(self.path)!r}, version={self.version!r})"

    def __enter__(self) -> IsolatedHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (a later call starts fresh ones)."""
        for closer in self._closers.values():
            closer()  # pool.close(), once
        self._pools, self._closers = {}, {}

    # ------------------------------------------------------------ the boundary

    def _call(self, message: tuple, pool_name: str = "calls") -> Any:
        """One request, one reply; any fault of the harness is a HarnessError naming it.
        Scoring and the curriculum go to a worker of their own ("scoring") that sees exactly
        what a backtest worker sees (harness/calls.py); everything else to "calls"."""
        try:
            pool = self._pools.get(pool_name)
            if pool is None:
                pool = SandboxPool([(LABEL, self.sources)], self.job, 1, self.limits)
                pool.__enter__()
                self._pools[pool_name] = pool
                self._closers[pool_name] = weakref.finalize(self, pool.close)
            for _, reply in pool.imap([message]):
                return reply
        except CandidateFailure as failure:
            self.close()  # the pool closed its workers; the next call starts fresh ones
            raise HarnessError(f"harness {self.version[:12]}: {failure.reason}") from None
        raise HarnessError(f"harness {self.version[:12]}: no reply from the sandbox worker")

    @contextmanager
    def _named(self) -> Iterator[None]:
        """A HarnessError raised by a check of a reply names the harness commit (the one the
        loop reverts), as one raised by the worker does."""
        try:
            yield
        except HarnessError as exc:
            if str(exc).startswith("harness "):
                raise
            raise HarnessError(f"harness {self.version[:12]}: {exc}") from None

    def score(self, groups: Sequence[Sequence[list]]) -> dict[str, list]:
        """Score frozen groups (harness/calls.py, frozen_row) in one round trip to the scoring
        worker, as a backtest would: the raw reply, checked by the caller (train/recorder.py)."""
        reply = self._call(("groups", [list(g) for g in groups]), "scoring")
        if not isinstance(reply, dict):
            raise HarnessError("the scoring reply is not a mapping")
        return reply

    def _describe(self) -> dict:
        if self._described is None:
            described = self._call(("describe",))
            if not isinstance(described, dict) or not isinstance(described.get("prompt"), str):
                with self._named():
                    raise HarnessError("rollout.py: PROMPT did not come back as a string")
            self._described = described
        return self._described

    # ------------------------------------------------------------ data (checked here)

    @property
    def prompt_source(self) -> str:
        """rollout.py's PROMPT as text, read here without running rollout.py."""
        return prompt_template(self.sources["rollout.py"])

    def check(self) -> None:
        """Load it (in the worker: the template compiles there) and check its probes here."""
        self.probes  # noqa: B018 -- validated on access

    def render_prompts(self, questions: Sequence[str], scaffold: str | None = None) -> list[str]:
        """PROMPT rendered for each question by the trusted prompt worker (harness/prompts.py),
        with only the question and the scaffold as inputs."""
        try:
            return render_prompts(self.prompt_source, questions, scaffold)
        except HarnessError as exc:
            raise HarnessError(f"harness {self.version[:12]}: {exc}") from None

    def render_prompt(self, question: str, scaffold: str | None = None) -> str:
        return self.render_prompts([question], scaffold)[0]

    @property
    def probes(self) -> list[Probe]:
        """The probes' names and thresholds (validated here); each fn is a call to the worker."""
        raw = self._describe()["probes"]
        if not isinstance(raw, list):
            raise HarnessError("diagnostics.py: PROBES did not come back as a list")
        specs = [dict(p, fn=self._probe_fn(p.get("name"))) if isinstance(p, dict) else p for p in raw]
        return validate_probes(specs)

    def _probe_fn(self, name: Any) -> Callable[[Sequence[Rollout], Sequence[float]], Any]:
        def fn(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> Any:
            reply = self._call(("probe", name, [rollout_to_dict(r) for r in rollouts],
                                [float(w) for w in rewards]))
            if not (isinstance(reply, list) and len(reply) == 2 and reply[0] in ("value", "error")):
                raise HarnessError(f"harness {self.version[:12]}: diagnostics.py: probe {name}(): "
                                   "the sandbox worker sent a malformed reply")
            kind, value = reply
            if kind == "error":
                raise HarnessError(str(value))
            return value  # Probe.evaluate validates it here

        return fn

    def probe_values(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float | None]:
        """Every probe's value on one batch, by probe name."""
        return {p.name: p.evaluate(rollouts, rewards) for p in self.probes}

    def training_reward(self, components: Mapping[str, float]) -> float:
        """The weighted sum of reward components; a component without a weight counts 1.0.
        Within REWARD_BOUND, as every reward() is (rewards() checks both), so the sums, squares
        and advantages a step makes of a batch of them stay finite."""
        weights = self.spec.reward_weights
        return float(sum(weights.get(name, 1.0) * value for name, value in components.items()))

    # ------------------------------------------------------------ batched calls

    def rewards(self, rollouts: Sequence[Rollout]) -> list[dict[str, float]]:
        """reward() of every rollout, in one round trip."""
        if not rollouts:
            return []
        values = self._call(("reward", [rollout_to_dict(r) for r in rollouts]))
        with self._named():
            if not isinstance(values, list) or len(values) != len(rollouts):
                raise HarnessError("reward.py: reward() replies do not match the rollouts sent")
            out = [validate_reward(v) for v in values]
            for components in out:
                validate_training_reward(self.training_reward(components), components)
        return out

    def filters(self, groups: Sequence[tuple[Sequence[Rollout], Sequence[float]]]) -> list[list[bool]]:
        """Per group, the kept flag of each rollout (keep_group and keep_rollout), in one round trip."""
        if not groups:
            return []
        values = self._call(("filters", [([rollout_to_dict(r) for r in rs], [float(w) for w in ws])
                                         for rs, ws in groups]))
        with self._named():
            return self._kept(groups, values)

    @staticmethod
    def _kept(groups: Sequence[tuple[Sequence[Rollout], Sequence[float]]], values: Any) -> list[list[bool]]:
        if not isinstance(values, list) or len(values) != len(groups):
            raise HarnessError("filters.py: replies do not match the groups sent")
        out = []
        for (rollouts, _), value in zip(groups, values):
            if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)
                    and len(value[1]) == len(rollouts)):
                raise HarnessError("filters.py: replies do not match the groups sent")
            group = validate_bool(value[0], "filters.py: keep_group()")
            keeps = [validate_bool(k, "filters.py: keep_rollout()") for k in value[1]]
            out.append([group and k for k in keeps])
        return out

    # The single-item forms of the Harness interface, for callers that have one item.

    def reward(self, rollout: Rollout) -> dict[str, float]:
        return self.rewards([rollout])[0]

    def weights(self, task_stats: Sequence[TaskStats]) -> dict[str, float]:
        stats = tuple(task_stats)
        rows = [_stats_row(s) for s in stats]
        value = self._call(("weights", rows), "scoring")
        self.curriculum_rows = rows  # the audit's fresh worker gets the same call first (train/audit.py)
        with self._named():
            if not isinstance(value, dict) or set(value) != {"weights"}:
                raise HarnessError("curriculum.py: weights() reply is malformed")
            return validate_weights(value["weights"], [s.task_id for s in stats])

    def stop(self, turns: Sequence[Turn]) -> str | None:
        value = self._call(("stop", [(t.role, t.content) for t in turns]))
        with self._named():
            return validate_stop(value)


def isolated_from_folder(folder: Path | str, limits: SandboxLimits = SandboxLimits()) -> IsolatedHarness:
    """The harness in a plain folder (a shipped seed), isolated like one from the repo."""
    from evotrainer.harness.loader import read_sources

    return IsolatedHarness(read_sources(folder), Path(folder), limits=limits)
