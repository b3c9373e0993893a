"""The judged domain: tasks from JSONL whose outcome is the voting judge panel's verdict.

A line is `{"task_id", "instruction", "eval_criteria"}` (criteria: a string or a list of
strings; optional `level`). The policy sees the instruction. The panel (evotrainer/judge/panel.py,
built from the config's `judge` section) sees the instruction, the criteria and the completion,
and success is its unanimous pass. There is no trusted check here, so every outcome carries the
JUDGE_VERIFIED flag: held-out success built on it is reported as judge-verified, and the held-out
guard does not gate on it (coevolve/heldout.py). A missing vote or an unreachable judge is kind
`error`, never a success; a split vote is a failure (`wrong`, flag `judge_disputed`). Empty and
truncated completions are not sent to the judge.

Held-out lines may also carry `completion` and `human_label` (true/false or "pass"/"fail"): a
person's verdict on that response. `human_agreement()` asks the panel about each and compares
(accuracy, Cohen's kappa); `record_agreement(workdir)` writes that to
<workdir>/judge_agreement.json, which the report shows beside the judge-verified numbers.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotrainer.api import JUDGE_VERIFIED, Outcome, Rollout
from evotrainer.config import JudgeConfig
from evotrainer.domains.base import Task, check_split
from evotrainer.domains.math import split_of
from evotrainer.jsonfile import iter_jsonl

DOMAIN = "judged"
META_KEY = "judged"  # rollout.meta["judged"]: the panel's summary behind the outcome
AGREEMENT_FILE = "judge_agreement.json"
CACHE_SIZE = 4096  # (task, completion) verdicts kept in memory: a group's identical answers ask once
_LABELS = {True: True, False: False, "pass": True, "fail": False, "true": True, "false": False}


@dataclass(frozen=True)
class Labelled:
    """A response a person labelled: the held-out set the judge's agreement is measured on."""

    task: Task
    completion: str
    human: bool


def _criteria(value: Any, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(c, str) and c.strip() for c in items):
        raise ValueError(f"{where}: 'eval_criteria' must be a non-empty string or a list of non-empty strings")
    return [c.strip() for c in items]


def _human_label(value: Any, where: str) -> bool:
    key = value.strip().lower() if isinstance(value, str) else value
    if isinstance(key, (bool, str)) and key in _LABELS:
        return _LABELS[key]
    raise ValueError(f"{where}: 'human_label' must be true/false or \"pass\"/\"fail\", got {value!r}")


def load_judged(path: str | Path, split: str | None = None,
                heldout_fraction: float = 0.2) -> tuple[list[Task], list[Labelled]]:
    """The tasks of a judged-tasks JSONL file, and its human-labelled responses.

    `split` puts every line in one split; None splits by a hash of the normalized instruction
    (not by file order).
    Ids are kept as written. A bad line raises ValueError naming the file and line number."""
    path = Path(path)
    tasks: list[Task] = []
    labelled: list[Labelled] = []
    seen: dict[str, int] = {}
    for where, lineno, row in iter_jsonl(path, "judged-tasks JSONL"):
        task_id = row.get("task_id")
        if isinstance(task_id, int) and not isinstance(task_id, bool):
            task_id = str(task_id)
        if not isinstance(task_id, str) or not task_id.strip():
            raise ValueError(f"{where}: 'task_id' must be a non-empty string")
        if task_id in seen:
            raise ValueError(f"{where}: task_id {task_id!r} repeats line {seen[task_id]}")
        seen[task_id] = lineno
        instruction = row.get("instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError(f"{where}: 'instruction' must be a non-empty string")
        criteria = _criteria(row.get("eval_criteria"), where)
        level = row.get("level", 0)
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise ValueError(f"{where}: 'level' must be a whole number >= 0")
        task = Task(task_id=task_id, domain=DOMAIN, level=level, prompt=instruction.strip(),
                    # by the instruction, so one instruction under two ids never sits in both splits
                    split=split or split_of("judged:" + " ".join(instruction.split()).lower(), heldout_fraction),
                    answer="\n".join(criteria),  # the rubric: shown to the judge, not the policy
                    meta={"eval_criteria": criteria, "source": str(path), "line": lineno})
        tasks.append(task)
        if "human_label" in row:
            completion = row.get("completion")
            if not isinstance(completion, str):
                raise ValueError(f"{where}: 'human_label' needs 'completion', the response the person labelled")
            labelled.append(Labelled(task, completion, _human_label(row["human_label"], where)))
    return tasks, labelled


def judge_prompt(task: Task) -> str:
    """What the panel reads as the task: the instruction and its criteria (a Jinja template)."""
    from evotrainer.judge.runtime import templates

    criteria = task.meta.get("eval_criteria") or task.answer.splitlines()
    return templates.get_template("judged_task.md.j2").render(instruction=task.prompt, criteria=criteria)


def binary_agreement(pairs: list[tuple[bool, bool]]) -> dict[str, Any]:
    """(judge, human) pass/fail pairs: counts, accuracy and Cohen's kappa (None when undefined:
    no pairs, or both sides gave one class only)."""
    n = len(pairs)
    both = sum(j and h for j, h in pairs)
    judge_only = sum(j and not h for j, h in pairs)
    human_only = sum(h and not j for j, h in pairs)
    neither = n - both - judge_only - human_only
    out: dict[str, Any] = {"judged": n, "both_pass": both, "judge_pass_human_fail": judge_only,
                           "judge_fail_human_pass": human_only, "both_fail": neither,
                           "accuracy": None, "kappa": None}
    if n:
        observed = (both + neither) / n
        pj, ph = (both + judge_only) / n, (both + human_only) / n
        chance = pj * ph + (1 - pj) * (1 - ph)
        out["accuracy"] = observed
        out["kappa"] = (observed - chance) / (1 - chance) if chance < 1 else None
    return out


class JudgedDomain:
    """Instruction + criteria tasks from JSONL, judged by the configured voting panel.

    `source`: the tasks file; `heldout_source`: a second file that is the whole held-out split
    (else `heldout_fraction` of `source`, by instruction); `judge`: a JudgeConfig or its dict (the
    trainer passes config.judge; without one, JudgeConfig() and its environment variables)."""

    name = DOMAIN

    def __init__(self, source: str | Path, heldout_source: str | Path | None = None,
                 heldout_fraction: float = 0.2, judge: JudgeConfig | Mapping[str, Any] | None = None) -> None:
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if str(source) == "procedural" or not Path(source).is_file():
            raise ValueError(f"judged source {str(source)!r} is not a file (domain.source: a JSONL of "
                             "task_id, instruction, eval_criteria)")
        if heldout_source is None:
            self._pool, labelled = load_judged(source, None, heldout_fraction)
            self.labelled = [x for x in labelled if x.task.split == "heldout"]  # labels in train are not a test
        else:
            train, _ = load_judged(source, "train")
            heldout, self.labelled = load_judged(heldout_source, "heldout")
            shared = {t.task_id for t in train} & {t.task_id for t in heldout}
            prompts = {t.prompt for t in train} & {t.prompt for t in heldout}
            if shared or prompts:
                raise ValueError(f"{heldout_source}: shares {len(shared)} task id(s) and {len(prompts)} "
                                 f"instruction(s) with {source}" + (f", e.g. {sorted(shared)[0]}" if shared else ""))
            self._pool = train + heldout
        self.source, self.heldout_source = str(source), heldout_source and str(heldout_source)
        self.config = judge if isinstance(judge, JudgeConfig) else JudgeConfig.model_validate(dict(judge or {}))
        from evotrainer.judge import JudgePanel, make_backend

        self.backend = make_backend(self.config)  # a bad judge config fails here, not in round 1
        self.panel = JudgePanel.from_config(self.config, self.backend)
        self._cache: OrderedDict[str, tuple[Outcome, dict[str, Any]]] = OrderedDict()
        self._agreement: dict[str, Any] | None = None

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = [t for t in self._pool if t.split == split]
        random.Random(f"judged:{split}:{seed}").shuffle(pool)
        return pool[:n]

    def all_tasks(self) -> list[Task]:
        return list(self._pool)

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        return self.check_meta(task, completion, truncated)[0]

    def check_meta(self, task: Task, completion: str, truncated: bool) -> tuple[Outcome, dict[str, Any]]:
        """The outcome and rollout meta (`judged`: the panel's label, quality and votes)."""
        if not isinstance(completion, str) or not completion.strip():
            return Outcome(False, 0.0, "empty", (JUDGE_VERIFIED,)), {}
        if truncated:  # cut by the length limit: unfinished, and a judge may pass a partial answer
            return Outcome(False, 0.0, "truncated", (JUDGE_VERIFIED,)), {}
        key = hashlib.sha256(f"{task.task_id}\0{task.answer}\0{completion}".encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            outcome, summary = self._cache[key]
            return outcome, {META_KEY: dict(summary)}
        try:
            rollout = Rollout(f"{task.task_id}#{key[:12]}", task.task_id, "", DOMAIN, judge_prompt(task), completion,
                              (), Outcome(False, 0.0, "wrong"), 0, False)  # the panel never reads the outcome
            result = self._vote(rollout)
        except Exception as exc:  # an unreachable or refusing endpoint: no verdict, never a pass
            reason = f"{type(exc).__name__}: {exc}"[:500]
            return (Outcome(False, 0.0, "error", (JUDGE_VERIFIED, "judge_unavailable")),
                    {META_KEY: {"label": "unavailable", "error": reason}})
        summary = result.summary()
        score = (result.quality - 1) / 4 if result.quality is not None else 0.0
        if result.label == "missing":  # asked again next time, like the panel's own cache
            return Outcome(False, 0.0, "error", (JUDGE_VERIFIED, "judge_missing")), {META_KEY: summary}
        flags = (JUDGE_VERIFIED,) if result.label != "disputed" else (JUDGE_VERIFIED, "judge_disputed")
        outcome = Outcome(result.label == "success", score, "ok" if result.label == "success" else "wrong", flags)
        self._cache[key] = (outcome, summary)
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return outcome, {META_KEY: summary}

    def _vote(self, rollout: Rollout) -> Any:
        """The panel's result. Over an endpoint the roles ask at once (a check waits for the
        slowest role, not for all in turn); a local model answers one prompt at a time."""
        from evotrainer.judge import PanelResult, decide

        judges = self.panel.judges
        if self.config.backend != "openai" or len(judges) == 1:
            return self.panel.judge(rollout)
        with ThreadPoolExecutor(len(judges)) as pool:
            votes = dict(zip([j.role.name for j in judges], pool.map(lambda j: j.judge(rollout), judges)))
        label, quality = decide(votes)
        return PanelResult(rollout.id, label, quality, votes)

    def human_agreement(self) -> dict[str, Any] | None:
        """The panel against the people on the human-labelled held-out responses (None without
        any). A response the panel gave no verdict on is counted in `unjudged`, not as a fail."""
        if not self.labelled:
            return None
        pairs, unjudged = [], 0
        for item in self.labelled:
            outcome = self.check(item.task, item.completion, False)
            if outcome.kind == "error":
                unjudged += 1
            else:
                pairs.append((outcome.success, item.human))
        return {"n": len(self.labelled), "unjudged": unjudged, **binary_agreement(pairs),
                "judge": {"backend": self.config.backend, "model": self.backend.model,
                          "roles": [r.name for r in self.config.roles]},
                "source": self.heldout_source or self.source}

    def record_agreement(self, workdir: str | Path) -> dict[str, Any] | None:
        """human_agreement(), measured once per domain object and written to
        <workdir>/judge_agreement.json for the report."""
        from evotrainer.jsonfile import write_json

        if self._agreement is None:
            self._agreement = self.human_agreement()
            if self._agreement is not None:
                write_json(Path(workdir) / AGREEMENT_FILE, self._agreement, indent=2, sort_keys=True)
        return self._agreement


__all__ = ["AGREEMENT_FILE", "DOMAIN", "JudgedDomain", "Labelled", "META_KEY", "binary_agreement",
           "judge_prompt", "load_judged"]
