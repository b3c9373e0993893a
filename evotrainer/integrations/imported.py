"""Another engine's rollouts as stored rollouts: one run, one round per import, all or nothing.

An engine's record (a line of verl's dump, a row of vf-eval's results, a TRL step) keeps the
engine's own score as what it is, the training reward (`StoredRollout.reward`). Its verified
outcome comes from one of two places, and the store says which:

- the workspace's domain rechecks the completion against the record's ground truth (`--domain`):
  the outcome is verified by us, exactly as our own trainer would have scored it;
- the user names the record's field that holds the engine's correctness (`--outcome-field acc`):
  the outcome carries the `api.SOURCE_REPORTED` flag and the rollout's meta says which field,
  and every report that counts outcomes says they were reported by the source, not verified.

Nothing is stored until every record has passed: a bad record is `file:line: what is wrong`,
never what the file holds (store/line_checks.py's rule).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evotrainer.api import SOURCE_REPORTED, Outcome, Rollout
from evotrainer.errors import UserError
from evotrainer.integrations.scoring import task_key
from evotrainer.store import Store, StoredRollout
from evotrainer.store.jsonl import add_or_refuse
from evotrainer.store.line_checks import check_columns

SOURCES = ("verl", "verifiers", "trl")
OUTCOME_BY_KEY = "outcome_by"  # rollout meta: "domain:<name>" or "source:<field>"
SOURCE_KEY = "source"  # rollout meta: the engine it came from
# Keys that hold a task's answer or tests, wherever they sit in an engine's record (verifiers'
# `info` often carries one): dropped from the kept fields, so the agent's tools, which hide only
# meta's own top-level `answer` (tools/surface.py SECRET_META), never show the ground truth.
SECRET_KEYS = frozenset({"answer", "answers", "gts", "ground_truth", "tests", "hidden_tests", "gold_patch",
                         "solution", "reference"})


@dataclass(frozen=True)
class Record:
    """One rollout as an engine wrote it, in the engine's own terms."""

    where: str  # the file (or "trl step N") it came from
    line: int
    step: int | None
    prompt: str
    completion: str
    answer: str | None  # the ground truth the domain rechecks against; None: the source has none
    score: float | None  # the engine's reward for this completion
    group: str | None  # the engine's own group key; None: rollouts of one prompt in one step form a group
    fields: Mapping[str, Any] = field(default_factory=dict)  # the rest of the record, kept in meta
    components: Mapping[str, float] = field(default_factory=dict)  # per reward function, when the engine has them
    num_tokens: int = 0
    truncated: bool = False


@dataclass(frozen=True)
class OutcomePolicy:
    """Where a verified outcome comes from: the domain's recheck, or a named field of the source."""

    domain: str
    field: str | None = None

    @property
    def label(self) -> str:
        return f"source:{self.field}" if self.field else f"domain:{self.domain}"


class SourceErrors(UserError):
    """Records that cannot be stored; nothing was. `errors` holds (where, line, message)."""

    def __init__(self, errors: list[tuple[str, int, str]]):
        self.errors = sorted(errors)
        where, line, message = self.errors[0]
        super().__init__(f"{len(errors)} bad record(s), nothing imported; first: {where}:{line}: {message}")


def record_error(where: str, line: int, message: str) -> tuple[str, int, str]:
    """A bad record's error. Messages are built here and in the readers from our own names (the
    engine's documented field names, the --outcome-field the user gave), never from values: the
    JSON parser's own (line_checks.parse) already says nothing of the line."""
    return where, line, message


def number(value: Any, name: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"field {name!r} must be a finite number")
    return float(value)


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string")
    return value


def _digest(*parts: object, n: int = 16) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).hexdigest()[:n]


def as_text(value: Any) -> str:
    """A TRL prompt or completion as text: a string, or a conversation's messages joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in value)
    return str(value)


def scrub(value: Any) -> Any:
    """`value` without any SECRET_KEYS entry, at any depth (iteratively: records nest deep)."""
    out: Any = {} if isinstance(value, dict) else [] if isinstance(value, list) else value
    stack = [(value, out)]
    while stack:
        src, dst = stack.pop()
        items = ((k, v) for k, v in src.items() if k not in SECRET_KEYS) if isinstance(src, dict) else enumerate(src)
        for key, item in items:
            copy: Any = {} if isinstance(item, dict) else [] if isinstance(item, list) else item
            if isinstance(dst, dict):
                dst[key] = copy
            else:
                dst.append(copy)
            if isinstance(item, (dict, list)):
                stack.append((item, copy))
    return out


def reported_outcome(value: Any, name: str) -> Outcome:
    """The engine's correctness field as an outcome: true/false or 1/0, marked source-reported."""
    if isinstance(value, bool):
        success = value
    elif isinstance(value, (int, float)) and value in (0, 1):
        success = bool(value)
    else:
        raise ValueError(f"field {name!r} (the --outcome-field) must be true/false or 1/0")
    return Outcome(success, 1.0 if success else 0.0, "ok" if success else "wrong", (SOURCE_REPORTED,))


class Converter:
    """Records to stored rollouts under one outcome policy (the domain built once)."""

    def __init__(self, source: str, run: str, policy: OutcomePolicy):
        from evotrainer.domains import get_domain

        self.source, self.run, self.policy = source, run, policy
        self.domain = None if policy.field else get_domain(policy.domain)

    def outcome(self, rec: Record, task_id: str) -> Outcome:
        if self.policy.field:
            if self.policy.field not in rec.fields:
                raise ValueError(f"missing field {self.policy.field!r} (the --outcome-field)")
            return reported_outcome(rec.fields[self.policy.field], self.policy.field)
        if rec.answer is None:
            raise ValueError(f"no ground truth to recheck with --domain {self.policy.domain} "
                             "(name the engine's correctness field with --outcome-field)")
        from evotrainer.domains.base import Task

        task = Task(task_id, self.policy.domain, "train", 0, rec.prompt, rec.answer)
        assert self.domain is not None
        return self.domain.check(task, rec.completion, rec.truncated)

    def convert(self, rec: Record) -> StoredRollout:
        task_id = task_key(rec.prompt, rec.answer)
        key = rec.group if rec.group is not None else rec.prompt
        group_id = f"{self.source}-{_digest(self.run, rec.step, key, n=12)}"
        rid = f"{self.source}-{_digest(self.run, Path(rec.where).name, rec.line, rec.step, rec.prompt, rec.completion, n=24)}"
        meta: dict[str, Any] = {SOURCE_KEY: self.source, OUTCOME_BY_KEY: self.policy.label,
                                self.source: scrub(dict(rec.fields))}
        if rec.answer is not None:
            meta["answer"] = rec.answer  # hidden from the agent's tools like our own tasks' answers
        rollout = Rollout(id=rid, task_id=task_id, group_id=group_id, domain=self.policy.domain,
                          prompt=rec.prompt, completion=rec.completion, turns=(),
                          outcome=self.outcome(rec, task_id), num_tokens=rec.num_tokens,
                          truncated=rec.truncated, meta=meta)
        components = dict(rec.components) or ({} if rec.score is None else {"score": rec.score})
        sr = StoredRollout(rollout=rollout, reward_components=components, reward=rec.score,
                           model_version=self.source, step=rec.step)
        check_columns(sr)
        return sr


@dataclass(frozen=True)
class Imported:
    run: str
    round: int
    rollouts: int
    outcome_by: str


def next_round(store: Store, run: str) -> int:
    run_id = store.run_id(run)
    indices = [r["index"] for r in store.rounds(run_id)] if run_id is not None else []
    return max(indices, default=-1) + 1


@dataclass(frozen=True)
class Converted:
    """Records that passed, as stored rollouts, and where each came from."""

    source: str
    run: str
    policy: OutcomePolicy
    rows: list[tuple[str, int, StoredRollout]]
    tasks: list[dict[str, Any]]


def convert_records(source: str, records: Iterable[Record], *, run: str, policy: OutcomePolicy,
                    errors: Sequence[tuple[str, int, str]] = ()) -> Converted:
    """Every record as a stored rollout, or SourceErrors (with `errors`, those the reader found)."""
    bad = list(errors)
    converter = Converter(source, run, policy)
    rows: list[tuple[str, int, StoredRollout]] = []
    first: dict[str, tuple[str, int]] = {}
    tasks: dict[str, dict[str, Any]] = {}
    for rec in records:
        try:
            sr = converter.convert(rec)
        except ValueError as exc:
            bad.append(record_error(rec.where, rec.line, str(exc)))
            continue
        if sr.rollout.id in first:
            bad.append((rec.where, rec.line, "the same record twice (first at {}:{})".format(*first[sr.rollout.id])))
            continue
        first[sr.rollout.id] = (rec.where, rec.line)
        rows.append((rec.where, rec.line, sr))
        if rec.answer is not None:
            tasks[sr.rollout.task_id] = {"task_id": sr.rollout.task_id, "split": "train", "prompt": rec.prompt,
                                         "answer": rec.answer}
    if bad:
        raise SourceErrors(bad)
    if not rows:
        raise UserError("no records to import")
    return Converted(source, run, policy, rows, list(tasks.values()))


@dataclass(frozen=True)
class Target:
    """The run and round imported rollouts go into."""

    run: str
    run_id: int
    round: int
    round_id: int


def open_round(store: Store, source: str, run: str, policy: OutcomePolicy, round_index: int | None = None) -> Target:
    """The run (made if missing, its config saying where its rollouts came from) and a round of it."""
    run_id = store.get_or_create_run(run, policy.domain, {"imported_from": source, OUTCOME_BY_KEY: policy.label})
    index = next_round(store, run) if round_index is None else round_index
    round_id = store.start_round(run_id, index, harness_version="imported", model_version=source)
    return Target(run, run_id, index, round_id)


def check_new(store: Store, done: Converted) -> None:
    """SourceErrors naming each record already in the store."""
    where = {sr.rollout.id: (w, line) for w, line, sr in done.rows}
    clash = [(*where[rid], "already in the store (imported before)") for rid in store.existing_ids(where)]
    if clash:
        raise SourceErrors(clash)


def add_converted(store: Store, done: Converted, target: Target) -> int:
    """Store converted rollouts in `target`, all or none; SourceErrors for any already stored."""
    check_new(store, done)
    store.upsert_tasks(done.policy.domain, done.tasks)
    return add_or_refuse(store, [replace(sr, run_id=target.run_id, round_id=target.round_id) for _, _, sr in done.rows])


def store_converted(store: Store, done: Converted, round_index: int | None = None) -> Imported:
    """Store converted rollouts as a new round of their run; SourceErrors (nothing stored, no
    round made) for any already in the store."""
    check_new(store, done)
    target = open_round(store, done.source, done.run, done.policy, round_index)
    added = add_converted(store, done, target)
    return Imported(done.run, target.round, added, done.policy.label)


def store_records(store: Store, source: str, records: Iterable[Record], *, run: str, policy: OutcomePolicy,
                  round_index: int | None = None, errors: Sequence[tuple[str, int, str]] = ()) -> Imported:
    """Convert every record, then store them all as one round of `run`, or raise SourceErrors
    and store nothing."""
    return store_converted(store, convert_records(source, records, run=run, policy=policy, errors=errors),
                           round_index)


def read_each(files: Iterable[Path], read: Callable[[Path], tuple[list, list]]) -> tuple[list, list]:
    """Every record and every error of the files, read one by one with `read` (an engine's reader)."""
    records: list = []
    errors: list = []
    for path in files:
        got, bad = read(path)
        records.extend(got)
        errors.extend(bad)
    return records, errors
