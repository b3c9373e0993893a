"""A workspace's harness, at one commit, scoring another engine's completions.

What an exported reward function (verl), a TRL reward function or a verifiers Rubric calls. The
trusted side stays ours: the domain checks each completion against its ground truth (the verified
outcome), and the harness's reward.py and filters.py run only in a sandbox worker of an
`IsolatedHarness`, one round trip per batch. So a harness an LLM wrote gains no power by being
exported: in the user's trainer it can do exactly what it can do in ours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome, Rollout


@dataclass(frozen=True)
class Scored:
    reward: float  # the training reward: reward_weights applied to the components
    components: dict[str, float]
    outcome: Outcome


def task_key(prompt: str, answer: str | None) -> str:
    """The task id an imported record of this prompt and answer gets (integrations/imported.py)."""
    return "t-" + hashlib.sha256(f"{prompt}\x1f{answer}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


class HarnessScorer:
    """Scores completions with the harness `sources` at `commit`, under the domain's check."""

    def __init__(self, sources: Mapping[str, str], commit: str, domain: str):
        from evotrainer.domains import get_domain
        from evotrainer.harness.isolated import IsolatedHarness

        self.commit, self.domain_name = commit, domain
        self.domain = get_domain(domain)
        self.harness = IsolatedHarness(sources, Path(f"harness@{commit[:12]}"), version=commit[:12])

    @classmethod
    def from_workspace(cls, workdir: Path | str, rev: str = "main") -> HarnessScorer:
        from evotrainer.errors import UserError
        from evotrainer.harness.repo import HarnessRepo
        from evotrainer.workspace import Workspace

        ws = Workspace(workdir)
        if not ws.exists() or ws.domain is None:
            raise UserError(f"{workdir}: not a workspace (no harnesses/ git repo)")
        repo = HarnessRepo(ws.harnesses)
        commit = repo.resolve(rev)
        return cls(repo.sources(commit), commit, ws.domain)

    def close(self) -> None:
        self.harness.close()

    def __enter__(self) -> HarnessScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rollouts(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any],
                 groups: Sequence[str] | None = None) -> list[Rollout]:
        """Each completion as an api.Rollout, its outcome checked by the domain."""
        from evotrainer.domains.base import Task

        out = []
        for i, (prompt, completion, answer) in enumerate(zip(prompts, completions, answers, strict=True)):
            task_id = task_key(str(prompt), None if answer is None else str(answer))
            task = Task(task_id, self.domain_name, "train", 0, str(prompt), "" if answer is None else str(answer))
            outcome = self.domain.check(task, str(completion), False)
            group = groups[i] if groups is not None else task_id
            out.append(Rollout(id=f"x{i}", task_id=task_id, group_id=group, domain=self.domain_name,
                               prompt=str(prompt), completion=str(completion), turns=(), outcome=outcome,
                               num_tokens=0, truncated=False, meta={}))
        return out

    def score(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[Any]) -> list[Scored]:
        """The harness's reward of every completion, in one round trip to its sandbox worker."""
        rollouts = self.rollouts(prompts, completions, answers)
        comps = self.harness.rewards(rollouts)
        return [Scored(self.harness.training_reward(c), c, r.outcome) for r, c in zip(rollouts, comps)]

    def keep(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> list[bool]:
        """filters.py's verdict on each rollout, its groups by group_id (keep_group and keep_rollout)."""
        order: dict[str, list[int]] = {}
        for i, r in enumerate(rollouts):
            order.setdefault(r.group_id, []).append(i)
        groups = [([rollouts[i] for i in idx], [rewards[i] for i in idx]) for idx in order.values()]
        kept = [True] * len(rollouts)
        for idx, flags in zip(order.values(), self.harness.filters(groups)):
            for i, flag in zip(idx, flags):
                kept[i] = flag
        return kept
