"""Which stored rollouts a backtest replays: the selector, its pinned store scope, and chunks of whole groups.

The parent streams the selection's (seq, id, group_id) once, in store order, to fix the set
(count and a hash of the ordered ids) and to cut it into chunks of whole groups. Groups are
normally contiguous in insert order, and a chunk is only cut where the group changes; a group
whose rows are scattered (interleaved writers) goes whole with the chunk that holds its first
row (rows.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from evotrainer.backtest.ids_file import read_ids
from evotrainer.store import RolloutScope, Store

_MISSING_SAMPLE = 2000  # listed ids looked at to name the missing entries


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
    def parse(cls, text: str | None) -> Selector:
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
    def from_json(cls, data: Mapping[str, Any]) -> Selector:
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


@dataclass
class Selection:
    """A resolved selector: the pinned selector, its count, and (once streamed) the ids hash."""

    selector: Selector
    scope: RolloutScope | None  # None for listed ids; else what every read of the selection applies
    count: int
    ids_sha256: str = ""


def resolve(store: Store, selector: Selector) -> Selection:
    """Pin the selector to the rollouts stored now; ValueError for an unknown run or missing ids."""
    if selector.ids is not None:
        found = store.count_in(RolloutScope(), selector.ids)
        if found != len(selector.ids):
            sample = selector.ids[:_MISSING_SAMPLE]
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
    # limit counts rows, rounded up to finish the last group
    scope, count = store.pin(RolloutScope(run_id, selector.round, selector.domain, until_seq=selector.until_seq),
                             selector.limit)
    return Selection(replace(selector, until_seq=scope.until_seq), scope, count)


def _keys(store: Store, selection: Selection) -> Iterator[tuple[int, str, str]]:
    return store.rollout_keys(selection.scope, selection.selector.ids if selection.scope is None else None)


def plan_chunks(store: Store, selection: Selection, chunk_size: int) -> Iterator[tuple]:
    """Chunks of whole groups, streamed in store order; sets `selection.ids_sha256` when done.

    A chunk is ("range", lo_seq, hi_seq) for filter selectors and ("seqs", [seq...]) for listed
    ids (the parent then knows every group, so chunks hold whole groups by construction).
    """
    digest = hashlib.sha256()
    if selection.scope is None:
        groups: dict[str, list[int]] = {}  # in the order of each group's first row
        for seq, rid, group in _keys(store, selection):
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
    lo, hi, n, prev_group = None, 0, 0, None
    for seq, rid, group in _keys(store, selection):
        digest.update(rid.encode() + b"\n")
        if n >= chunk_size and group != prev_group:
            yield ("range", lo, hi)
            lo, n = None, 0
        if lo is None:
            lo = seq
        hi, n, prev_group = seq, n + 1, group
    selection.ids_sha256 = digest.hexdigest()
    if n:
        yield ("range", lo, hi)


def ids_sha256(store: Store, selection: Selection) -> str:
    """sha256 of the selected ids in store order, one per line (what plan_chunks computes)."""
    digest = hashlib.sha256()
    for _, rid, _ in _keys(store, selection):
        digest.update(rid.encode() + b"\n")
    return digest.hexdigest()


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


__all__ = ["Selection", "Selector", "history", "ids_sha256", "plan_chunks", "resolve"]
