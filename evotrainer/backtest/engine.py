"""Replay a base and a candidate harness over the same stored rollouts, in parallel sandboxed workers.

The parent streams the selection's (seq, id, group_id) once, in store order, to fix the set
(count and a hash of the ordered ids) and to cut it into chunks of whole groups. For each chunk
the parent reads the rows and sends them, as plain tuples, to a sandbox worker
(evotrainer.harness.sandbox), which holds both harnesses, builds frozen `api.Rollout`s (ground
truth comes from the stored columns, never from objects that harness code has touched), scores
them under both harnesses, and sends back one small Tally per harness. Memory: a page of keys in
the parent, a chunk or two per worker, whatever the store size.

Workers never open the store: they run in the OS sandbox, where the workspace does not exist.

Groups are normally contiguous in insert order, and a chunk is only cut where the group changes.
A group whose rows are scattered (interleaved writers) goes whole with the chunk that holds its
first row; the other chunks drop its rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from sqlalchemy import Text, cast, create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from evotrainer.api import Outcome, Rollout, TaskStats, Turn
from evotrainer.backtest.ids_file import read_ids
from evotrainer.backtest.metrics import Tally, group_advantages, is_flagged, reward_histogram
from evotrainer.config import GateConfig
from evotrainer.harness.loader import HARNESS_FILES
from evotrainer.harness.sandbox import CandidateFailure, SandboxedHarness, SandboxLimits, SandboxPool
from evotrainer.store import Store
from evotrainer.store.models import RolloutRow, Round

DEFAULT_CHUNK = 4096
_PAGE = 10_000  # (seq, id, group_id) rows per keyset page when the parent streams the selection
_IN = 500  # bound parameters per IN (...)
LABELS = ("base", "candidate")


# ---------------------------------------------------------------- selecting rollouts


@dataclass(frozen=True)
class Selector:
    """Which stored rollouts to replay. `until_seq` is filled in when a backtest resolves the
    selector, so a replay sees the same rollouts even after later rounds were stored."""

    run: str | None = None
    round: int | None = None
    domain: str | None = None
    limit: int | None = None
    ids: tuple[str, ...] | None = None
    until_seq: int | None = None

    def __post_init__(self) -> None:
        if self.ids is not None:
            object.__setattr__(self, "ids", tuple(dict.fromkeys(self.ids)))
            if not self.ids:
                raise ValueError("ids= names no rollout")
            if any(v is not None for v in (self.run, self.round, self.domain, self.limit)):
                raise ValueError("ids= cannot be combined with run=, round=, domain= or limit=")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")

    @classmethod
    def parse(cls, text: str | None) -> "Selector":
        """`run=default,round=2,domain=math,limit=5000`, `ids=@file.txt` (one id a line) or
        `ids=a;b;c`; empty or `all`: every stored rollout."""
        if not text or text.strip() == "all":
            return cls()
        fields: dict[str, Any] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not value:
                raise ValueError(f"selector part {part!r}: expected key=value")
            if key in fields:
                raise ValueError(f"selector key {key!r} given twice")
            if key in ("round", "limit"):
                try:
                    fields[key] = int(value)
                except ValueError:
                    raise ValueError(f"selector {key}= must be an integer, got {value!r}") from None
            elif key in ("run", "domain"):
                fields[key] = value
            elif key == "ids":
                if value.startswith("@"):
                    fields["ids"] = read_ids(Path(value[1:]).expanduser())
                else:
                    fields["ids"] = tuple(i.strip() for i in value.split(";") if i.strip())
            else:
                raise ValueError(f"unknown selector key {key!r} (known: run, round, domain, limit, ids)")
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ids"] = list(self.ids) if self.ids is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Selector":
        data = dict(data)
        if data.get("ids") is not None:
            data["ids"] = tuple(data["ids"])
        return cls(**data)

    def describe(self) -> str:
        if self.ids is not None:
            return f"{len(self.ids)} listed id(s)"
        parts = [f"{k}={v}" for k, v in (("run", self.run), ("round", self.round),
                                            ("domain", self.domain), ("limit", self.limit)) if v is not None]
        return ",".join(parts) or "all"


@dataclass(frozen=True)
class _Scope:
    """The SQL side of a resolved selector (picklable, so workers apply the very same filter)."""

    run_id: int | None
    round_index: int | None
    domain: str | None
    until_seq: int

    def where(self, query: Any) -> Any:
        c = RolloutRow.__table__.c
        query = query.where(c.seq <= self.until_seq)
        if self.run_id is not None:
            query = query.where(c.run_id == self.run_id)
        if self.round_index is not None:
            rounds = select(Round.id).where(Round.index == self.round_index)
            if self.run_id is not None:
                rounds = rounds.where(Round.run_id == self.run_id)
            query = query.where(c.round_id.in_(rounds))
        if self.domain is not None:
            query = query.where(c.domain == self.domain)
        return query


@dataclass
class Selection:
    """A resolved selector: the pinned selector, its count, and (once streamed) the ids hash."""

    selector: Selector
    scope: _Scope | None
    count: int
    ids_sha256: str = ""


def resolve(store: Store, selector: Selector) -> Selection:
    """Pin the selector to the rollouts stored now; ValueError for an unknown run or missing ids."""
    c = RolloutRow.__table__.c
    with store.engine.connect() as conn:
        if selector.ids is not None:
            found = 0
            for i in range(0, len(selector.ids), _IN):
                found += conn.scalar(select(func.count()).where(c.id.in_(selector.ids[i:i + _IN])))
            if found != len(selector.ids):
                sample = selector.ids[:_IN * 4]
                known = store.existing_ids(sample)
                # Entry numbers, not ids: the list may come from a file never meant to be shown.
                missing = [str(i) for i, rid in enumerate(sample, 1) if rid not in known]
                raise ValueError(f"{len(selector.ids) - found} of the {len(selector.ids)} listed rollout "
                                 f"id(s) are not in the store (list entries {', '.join(missing[:3])}"
                                 f"{', ...' if len(missing) > 3 else ''})")
            return Selection(selector, None, len(selector.ids))
        run_id = None
        if selector.run is not None:
            run_id = store.run_id(selector.run)
            if run_id is None:
                raise ValueError(f"no run named {selector.run!r} in the store")
        until = selector.until_seq
        if until is None:
            until = conn.scalar(select(func.max(c.seq))) or 0
        scope = _Scope(run_id, selector.round, selector.domain, until)
        if selector.limit is not None:
            nth = conn.execute(scope.where(select(c.seq, c.group_id)).order_by(c.seq)
                               .offset(selector.limit - 1).limit(1)).first()
            if nth is not None:  # limit counts rows, rounded up to finish the last group
                end = conn.scalar(scope.where(select(func.max(c.seq))).where(c.group_id == nth.group_id))
                scope = replace(scope, until_seq=max(nth.seq, end or nth.seq))
        count = conn.scalar(scope.where(select(func.count()).select_from(RolloutRow.__table__)))
    return Selection(replace(selector, until_seq=scope.until_seq), scope, count or 0)


def plan_chunks(store: Store, selection: Selection, chunk_size: int) -> Iterator[tuple]:
    """Chunks of whole groups, streamed in store order; sets `selection.ids_sha256` when done.

    A chunk is ("range", lo_seq, hi_seq) for filter selectors and ("seqs", [seq...]) for listed
    ids (the parent then knows every group, so chunks hold whole groups by construction).
    """
    digest = hashlib.sha256()
    c = RolloutRow.__table__.c
    if selection.scope is None:
        ids = selection.selector.ids
        with store.engine.connect() as conn:
            keys = sorted(tuple(r) for i in range(0, len(ids), _IN)
                          for r in conn.execute(select(c.seq, c.id, c.group_id).where(c.id.in_(ids[i:i + _IN]))))
        groups: dict[str, list[int]] = {}  # in the order of each group's first row
        for seq, rid, group in keys:
            digest.update(rid.encode() + b"\n")
            groups.setdefault(group, []).append(seq)
        selection.ids_sha256 = digest.hexdigest()
        batch: list[int] = []
        for n, seqs in enumerate(groups.values(), 1):
            batch += seqs
            if len(batch) >= chunk_size or n == len(groups):
                yield ("seqs", batch)
                batch = []
        return
    last, lo, hi, n, prev_group = 0, None, 0, 0, None
    while True:
        with store.engine.connect() as conn:
            page = conn.execute(selection.scope.where(select(c.seq, c.id, c.group_id))
                                .where(c.seq > last).order_by(c.seq).limit(_PAGE)).all()
        for seq, rid, group in page:
            digest.update(rid.encode() + b"\n")
            if n >= chunk_size and group != prev_group:
                yield ("range", lo, hi)
                lo, n = None, 0
            if lo is None:
                lo = seq
            hi, n, prev_group = seq, n + 1, group
        if len(page) < _PAGE:
            break
        last = page[-1][0]
    selection.ids_sha256 = digest.hexdigest()
    if n:
        yield ("range", lo, hi)


# ---------------------------------------------------------------- the worker side


_COLUMNS = ("seq", "id", "task_id", "group_id", "domain", "prompt", "completion", "turns",
            "outcome_success", "outcome_score", "outcome_kind", "outcome_flags", "num_tokens",
            "truncated", "meta")
_JSON_COLUMNS = ("turns", "outcome_flags", "meta")  # read as text: each harness parses its own copy


@dataclass(frozen=True)
class _Fact:
    """One stored rollout as trusted code sees it: ground truth plus what a Rollout is built from."""

    id: str
    group_id: str
    success: bool
    flagged: bool
    tokens: int
    fields: dict  # Rollout fields except meta
    meta_text: str
    nested_meta: bool
    trajectory: tuple[Turn, ...]

    def rollout(self, shared_meta: dict | None) -> Rollout:
        meta = shared_meta if shared_meta is not None else json.loads(self.meta_text)
        return Rollout(**self.fields, meta=meta)


def _loads_list(text: str | None) -> list:
    return [] if not text or text == "[]" else json.loads(text)


def _fact(row: Sequence[Any]) -> _Fact:
    (_seq, rid, task_id, group_id, domain, prompt, completion, turns_text, success, score, kind,
     flags_text, num_tokens, truncated, meta_text) = row
    turns = tuple(Turn(t["role"], t["content"]) for t in _loads_list(turns_text))
    flags = tuple(_loads_list(flags_text))
    outcome = Outcome(bool(success), float(score), kind, flags)
    meta_text = meta_text or "{}"
    # Harness code gets its own copy of nested meta, so one harness cannot edit what the other sees.
    nested = meta_text.count("{") > 1 or "[" in meta_text
    trajectory = turns or (Turn("user", prompt), Turn("assistant", completion))
    fields = dict(id=rid, task_id=task_id, group_id=group_id, domain=domain, prompt=prompt,
                  completion=completion, turns=turns, outcome=outcome, num_tokens=int(num_tokens),
                  truncated=bool(truncated))
    return _Fact(rid, group_id, bool(success), is_flagged(kind, flags), int(num_tokens), fields,
                 meta_text, nested, trajectory)


class _Reader:
    """The parent's reader of chunks: one chunk's rows, whole groups only, as plain tuples."""

    def __init__(self, url: str, scope: _Scope | None):
        self.engine = create_engine(url, poolclass=NullPool)
        self.scope = scope
        c = RolloutRow.__table__.c
        self.columns = [cast(c[n], Text) if n in _JSON_COLUMNS else c[n] for n in _COLUMNS]

    def chunk(self, message: tuple) -> list[tuple]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in self._rows(conn, message)]

    def _rows(self, conn: Any, message: tuple) -> list:
        c = RolloutRow.__table__.c
        if message[0] == "seqs":
            seqs = message[1]
            rows = [r for i in range(0, len(seqs), _IN)
                    for r in conn.execute(select(*self.columns).where(c.seq.in_(seqs[i:i + _IN])))]
            return sorted(rows, key=lambda r: r[0])
        _, lo, hi = message
        rows = conn.execute(self.scope.where(select(*self.columns)).where(c.seq >= lo, c.seq <= hi)
                            .order_by(c.seq)).all()
        local: dict[str, int] = {}
        for r in rows:
            local[r[3]] = local.get(r[3], 0) + 1
        split: dict[str, int] = {}  # group -> seq of its first selected row, if not all in [lo, hi]
        names = list(local)
        for i in range(0, len(names), _IN):
            query = (self.scope.where(select(c.group_id, func.count(), func.min(c.seq)))
                     .where(c.group_id.in_(names[i:i + _IN])).group_by(c.group_id))
            for group, total, first in conn.execute(query):
                if total != local[group]:
                    split[group] = first
        if not split:
            return rows
        out = [r for r in rows if r[3] not in split]
        for group, first in split.items():
            if lo <= first <= hi:  # this chunk holds the group's first row: read all of it
                out.extend(conn.execute(self.scope.where(select(*self.columns))
                                        .where(c.group_id == group).order_by(c.seq)))
        return out


@dataclass(frozen=True)
class ChunkJob:
    """What a sandbox worker does with a chunk (its rows, read and sent by the parent): score
    them under every harness. `url` and `scope` stay for the parent's reader; a worker uses neither."""

    url: str
    scope: _Scope | None
    determinism_sample: float = 0.02
    # The task history the selected round was drawn from (TaskStats of the run's earlier rounds):
    # with it, each group also gets its curriculum weight (metrics.py: sampled_dead_group_ratio).
    history: tuple | None = None
    # Each worker's copy of the job keeps the task shares it computed from the history: they are
    # the same for every chunk, so each harness's weights() runs once per worker, not per chunk.
    shares: dict = field(default_factory=dict, compare=False, repr=False)

    def open(self, trusted_io: Callable[[], Any]) -> None:
        return None

    def run(self, state: None, harnesses: Mapping[str, SandboxedHarness], rows: Sequence[tuple]) -> dict:
        groups: dict[str, list[_Fact]] = {}
        for fact in map(_fact, rows):
            groups.setdefault(fact.group_id, []).append(fact)
        threshold = int(self.determinism_sample * 2**32)
        checked = {g for g in groups if zlib.crc32(g.encode()) < threshold}
        checked.add(next(iter(groups), None))  # and always the first group of every chunk
        out = {}
        share = None
        if self.history:
            if not self.shares:
                self.shares.update({label: _task_shares(h, self.history) for label, h in harnesses.items()})
            share = self.shares
        for label, harness in harnesses.items():
            start = time.perf_counter()
            tally = Tally()
            for group_id, members in groups.items():
                weight = None
                if share is not None:  # p(task) under this harness over p(task) under the base
                    task = members[0].fields["task_id"]
                    drawn = share["base"].get(task, 0.0)
                    weight = share[label].get(task, 0.0) / drawn if drawn > 0 else None
                _score_group(harness, members, tally, group_id in checked, weight)
            tally.seconds = time.perf_counter() - start
            out[label] = tally.to_json()
        return out


def _task_shares(h: SandboxedHarness, history: tuple) -> dict[str, float]:
    """Each task's probability under the harness's curriculum, given the history
    ((task_id, attempts, successes, meta) rows)."""
    weights = h.weights(tuple(TaskStats(*row) for row in history))
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()} if total > 0 else {}


def _score_group(h: SandboxedHarness, members: list[_Fact], tally: Tally, check: bool,
                 weight: float | None = None) -> None:
    flat: dict[str, dict] = {}  # flat meta holds only immutable values: one parsed copy will do
    for f in members:
        if not f.nested_meta and f.meta_text not in flat:
            flat[f.meta_text] = json.loads(f.meta_text)
    rollouts = [f.rollout(None if f.nested_meta else flat[f.meta_text]) for f in members]
    current = members[0].id
    try:
        rewards, keeps, cuts, components = [], [], [], []
        for fact, rollout in zip(members, rollouts):
            current = fact.id
            comps = h.reward(rollout)
            value = h.training_reward(comps)
            if not math.isfinite(value):
                raise CandidateFailure(f"the training reward (weighted sum of {comps}) is {value}", h.label)
            components.append(comps)
            rewards.append(value)
            keeps.append(h.keep_rollout(rollout))
            cuts.append(_cut(h, fact.trajectory))
        current = None
        keep_group = h.keep_group(rollouts, rewards)
        if check:
            for i, (fact, rollout) in enumerate(zip(members, rollouts)):
                current = fact.id
                again = (h.reward(rollout), h.keep_rollout(rollout), _cut(h, fact.trajectory))
                if again != (components[i], keeps[i], cuts[i]):
                    what = ("reward()", "keep_rollout()", "stop()")[
                        [a == b for a, b in zip(again, (components[i], keeps[i], cuts[i]))].index(False)]
                    raise CandidateFailure(f"not deterministic: {what} gave a different result when "
                                           "the same rollout was scored twice", h.label)
            current = None
            if h.keep_group(rollouts, rewards) != keep_group:
                raise CandidateFailure("not deterministic: keep_group() gave a different result when "
                                       "the same group was scored twice", h.label)
    except CandidateFailure as failure:
        where = f"rollout {current}" if current else f"group {members[0].group_id}"
        raise CandidateFailure(f"{failure.reason} (on {where})", failure.harness) from None
    advantages = group_advantages(rewards, h.spec.grpo.get("scale_rewards", "group"))
    kept = [keep_group and k and not cut for k, cut in zip(keeps, cuts)]
    tally.add_group(rewards, advantages, [f.success for f in members], [f.flagged for f in members],
                    [f.tokens for f in members], kept, weight)


def _cut(h: SandboxedHarness, trajectory: tuple[Turn, ...]) -> bool:
    """Whether the harness's stop() would have cut this trajectory: it is asked after every
    assistant turn (the last included, where a single-turn rollout is asked once)."""
    for i, turn in enumerate(trajectory):
        if turn.role == "assistant" and h.stop(trajectory[:i + 1]) is not None:
            return True
    return False


# ---------------------------------------------------------------- running a backtest


@dataclass(frozen=True)
class HarnessVersion:
    """One side of a backtest: a commit sha (or any label) and its harness files."""

    sha: str
    sources: Mapping[str, str]


@dataclass
class BacktestRun:
    """What a backtest measured, before the gate."""

    selection: Selection
    metrics: dict[str, dict[str, Any]] | None
    failure: CandidateFailure | None
    timings: dict[str, float] = field(default_factory=dict)
    workers: int = 0
    # Training reward of verified successes and failures per side (metrics.reward_histogram),
    # from the same exact tallies as the metrics: the report draws it without replaying harnesses.
    distribution: dict[str, Any] | None = None


def worker_url(store: Store) -> str:
    """The store URL as another process can open it (an absolute SQLite path)."""
    url = make_url(store.url)
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise ValueError("backtests need a store in a file or on a server: workers read it themselves")
        if not url.database.startswith("file:"):
            url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=False)


def ids_sha256(store: Store, selection: Selection) -> str:
    """sha256 of the selected ids in store order, one per line (what plan_chunks computes)."""
    digest = hashlib.sha256()
    c = RolloutRow.__table__.c
    if selection.scope is None:
        with store.engine.connect() as conn:
            keys = sorted(tuple(r) for i in range(0, len(selection.selector.ids), _IN)
                          for r in conn.execute(select(c.seq, c.id).where(c.id.in_(selection.selector.ids[i:i + _IN]))))
        for _, rid in keys:
            digest.update(rid.encode() + b"\n")
        return digest.hexdigest()
    last = 0
    while True:
        with store.engine.connect() as conn:
            page = conn.execute(selection.scope.where(select(c.seq, c.id)).where(c.seq > last)
                                .order_by(c.seq).limit(_PAGE)).all()
        for _, rid in page:
            digest.update(rid.encode() + b"\n")
        if len(page) < _PAGE:
            return digest.hexdigest()
        last = page[-1][0]


def chunk_pool(executor: str) -> Callable[..., Any]:
    """The pool class that runs backtest chunks for an executor name (config `executor.kind`)."""
    if executor == "local":
        return SandboxPool
    if executor == "ray":
        from evotrainer.sandbox.ray_executor import RaySandboxPool

        return RaySandboxPool
    raise ValueError(f"unknown executor {executor!r}; known: local, ray")


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def history(store: Store, selector: Selector) -> tuple | None:
    """The task history a selection of one round of one run was drawn from: its run's TaskStats
    over the rounds before it (known tasks with no attempts included). None for other selections."""
    if selector.run is None or selector.round is None or selector.ids is not None:
        return None
    run_id = store.run_id(selector.run)
    domain = selector.domain or (store.run_domain(run_id) if run_id is not None else None)
    if run_id is None or domain is None:
        return None
    # plain tuples: TaskStats.meta is read-only (a mappingproxy), which cannot be pickled to workers
    # Held-out tasks are known to the store but never offered to a curriculum.
    return tuple((s.task_id, s.attempts, s.successes, dict(s.meta))
                 for s in store.task_stats(domain, run_id, before_round=selector.round)
                 if s.meta.get("split") != "heldout")


def run_backtest(store: Store, base: HarnessVersion, candidate: HarnessVersion, selector: Selector,
                 gate: GateConfig | None = None, *, workers: int | None = None,
                 chunk_size: int = DEFAULT_CHUNK,
                 on_progress: Callable[[int, int], None] | None = None,
                 executor: str = "local") -> BacktestRun:
    """Score the selected rollouts under both harnesses. A harness fault is returned as
    `failure` (metrics None), never raised; a bad selector raises ValueError.

    `executor`: "local" (sandbox worker processes here) or "ray" (the same sandbox workers,
    each inside a Ray actor; see evotrainer.sandbox.ray_executor)."""
    pool_class = chunk_pool(executor)
    gate = gate or GateConfig()
    selection = resolve(store, selector)
    if not selection.count:
        raise ValueError(f"selector {selector.describe()!r} matches no stored rollouts")
    workers = max(1, workers or default_workers())
    # Enough chunks to keep every worker busy on small selections.
    chunk_size = max(1, min(chunk_size, max(256, math.ceil(selection.count / (4 * workers)))))
    workers = min(workers, math.ceil(selection.count / chunk_size))
    start = time.perf_counter()
    totals = {label: Tally() for label in LABELS}
    failure, done = None, 0
    try:
        for label, version in zip(LABELS, (base, candidate)):
            missing = [f for f in HARNESS_FILES if f not in version.sources]
            if missing:
                raise CandidateFailure(f"{', '.join(missing)}: not found at {version.sha[:12]}", label)
        job = ChunkJob(worker_url(store), selection.scope, gate.determinism_sample, history(store, selector))
        limits = SandboxLimits(call_timeout_s=gate.call_timeout_s, load_timeout_s=gate.load_timeout_s,
                               message_timeout_s=gate.time_budget_s)
        sides = [(label, dict(v.sources)) for label, v in zip(LABELS, (base, candidate))]
        chunks = plan_chunks(store, selection, chunk_size)
        reader = _Reader(job.url, selection.scope)
        with pool_class(sides, job, workers, limits) as pool:
            ready = time.perf_counter()
            for _, reply in pool.imap(reader.chunk(message) for message in chunks):
                try:
                    tallies = {label: Tally.from_json(reply[label]) for label in LABELS}
                except (ValueError, TypeError, KeyError) as exc:
                    raise CandidateFailure(f"the sandbox worker sent malformed results ({exc})", "candidate")
                for label, tally in tallies.items():
                    totals[label].merge(tally)
                done += tallies["base"].rollouts
                if on_progress:
                    on_progress(done, selection.count)
                if totals["candidate"].seconds > gate.time_budget_s:
                    raise CandidateFailure(f"ran past its time budget of {gate.time_budget_s:g} s "
                                           f"after {done} of {selection.count} rollouts", "candidate")
    except CandidateFailure as exc:
        failure = exc
        if not selection.ids_sha256:  # still fix the set in the report: hash the rest of the ids
            selection.ids_sha256 = ids_sha256(store, selection)
    if failure is None and done != selection.count:
        raise RuntimeError(f"scored {done} rollouts but the selection has {selection.count}: "
                           "did the store change during the backtest?")
    wall = time.perf_counter() - start
    timings = {"wall_s": round(wall, 3), "base_s": round(totals["base"].seconds, 3),
               "candidate_s": round(totals["candidate"].seconds, 3)}
    if failure is None:
        timings["startup_s"] = round(ready - start, 3)
        timings["rollouts_per_s"] = round(selection.count / wall, 1) if wall else 0.0
        metrics = {label: totals[label].metrics() for label in LABELS}
        distribution = reward_histogram({label: totals[label].auc for label in LABELS})
        return BacktestRun(selection, metrics, None, timings, workers, distribution)
    return BacktestRun(selection, None, failure, timings, workers)


__all__ = ["BacktestRun", "ChunkJob", "DEFAULT_CHUNK", "HarnessVersion", "LABELS", "Selection",
           "Selector", "default_workers", "ids_sha256", "plan_chunks", "resolve", "run_backtest",
           "worker_url"]
