"""Self-attributing: a judge labels each assistant step of a trajectory GOOD or BAD.

A step is one assistant message plus the observation that followed it (the next non-assistant
messages). Labels land in `rollout.meta["step_labels"]`; `evotrainer.train.credit` turns them into
step-level advantages when the harness switches `step_credit` on. The step judge sees the verified
result (it attributes a known outcome to steps; it does not guess the outcome). A reply that stays
malformed after the retries gives no labels (None), never a made-up GOOD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evotrainer.api import Rollout, Turn
from evotrainer.judge.backends import JudgeBackend
from evotrainer.judge.records import STEP_META_KEY, JudgeRecords, StoredVerdict
from evotrainer.judge.runtime import ask, clip, prompt_hash, templates
from evotrainer.judge.verdict import parse_step_verdict


@dataclass(frozen=True)
class Step:
    action: str
    observation: str


def split_steps(turns: Sequence[Turn]) -> list[Step]:
    """Assistant turns, each with the text of the non-assistant turns up to the next one."""
    steps: list[Step] = []
    action, seen = None, []
    for turn in turns:
        if turn.role == "assistant":
            if action is not None:
                steps.append(Step(action, "\n".join(seen)))
            action, seen = turn.content, []
        elif action is not None:
            seen.append(turn.content)
    if action is not None:
        steps.append(Step(action, "\n".join(seen)))
    return steps


class StepJudge:
    """`step_judge(rollout) -> ["GOOD", "BAD", ...] | None`, one label per step, cached in the store."""

    role = "step"

    def __init__(self, backend: JudgeBackend, *, records: JudgeRecords | None = None, temperature: float = 0.0,
                 max_retries: int = 2, max_tokens: int = 256, max_chars: int = 6000) -> None:
        self.backend, self.records, self.temperature = backend, records, temperature
        self.max_retries, self.max_tokens, self.max_chars = max_retries, max_tokens, max_chars
        self.last_error: str | None = None

    def messages(self, rollout: Rollout, steps: Sequence[Step]) -> list[dict[str, str]]:
        share = max(200, self.max_chars // max(1, len(steps)))
        shown = [Step(clip(s.action, share), clip(s.observation, share // 2)) for s in steps]
        user = templates.get_template("step_rollout.md.j2").render(
            prompt=clip(rollout.prompt, self.max_chars), success=rollout.outcome.success, steps=shown)
        return [{"role": "system", "content": templates.get_template("step_system.md.j2").render()},
                {"role": "user", "content": user}]

    def __call__(self, rollout: Rollout, steps: Sequence[str] | None = None) -> list[str] | None:
        """Labels for the rollout's assistant turns, or for `steps` (texts) when given."""
        parsed = [Step(s, "") for s in steps] if steps is not None else split_steps(rollout.turns)
        if not parsed:
            return None
        messages = self.messages(rollout, parsed)
        key = prompt_hash(messages, temperature=self.temperature, max_tokens=self.max_tokens, kind="steps")
        if self.records is not None:
            hit = self.records.cached(self.backend.model, key, rollout.id)
            if hit is not None and hit.verdict is not None:
                return list(hit.verdict["labels"])
        verdict, error, attempts = ask(self.backend, messages, lambda text: parse_step_verdict(text, len(parsed)),
                                       temperature=self.temperature, max_tokens=self.max_tokens,
                                       max_retries=self.max_retries)
        self.last_error = error
        labels = list(verdict.labels) if verdict is not None else None
        if self.records is not None:
            self.records.put(StoredVerdict(rollout.id, self.backend.model, key, self.role, "steps",
                                           "ok" if labels is not None else "missing",
                                           {"labels": labels} if labels is not None else None, error, attempts))
            if labels is not None:
                self.records.set_meta(rollout.id, STEP_META_KEY, labels)
        return labels


__all__ = ["Step", "StepJudge", "split_steps"]
