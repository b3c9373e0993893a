"""JSONL export and import of stored rollouts, in the public `api.rollout_to_dict` shape."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from evotrainer.api import rollout_from_dict, rollout_to_dict
from evotrainer.store.store import Store, StoredRollout

# The store-only fields, carried in meta["train"] so the line stays a valid api rollout.
TRAIN_KEY = "train"
TRAIN_FIELDS = ("reward_components", "reward", "advantage", "kept", "model_version", "seed",
                "harness_version", "step")


@dataclass(frozen=True)
class ImportSummary:
    imported: int
    skipped: list[tuple[int, str]]


class ImportErrors(Exception):
    """A JSONL file had bad lines and nothing was stored; `errors` holds (line, message)."""

    def __init__(self, errors: list[tuple[int, str]]):
        self.errors = errors
        super().__init__(f"{len(errors)} bad line(s); first: line {errors[0][0]}: {errors[0][1]}")


def to_export_dict(sr: StoredRollout) -> dict[str, Any]:
    data = rollout_to_dict(sr.rollout)
    data["meta"][TRAIN_KEY] = {
        "reward_components": dict(sr.reward_components), "reward": sr.reward,
        "advantage": sr.advantage, "kept": sr.kept, "model_version": sr.model_version,
        "seed": sr.seed, "harness_version": sr.harness_version, "step": sr.step,
    }
    return data


def dumps(sr: StoredRollout) -> str:
    return json.dumps(to_export_dict(sr), sort_keys=True, ensure_ascii=False)


def _number(value: Any, name: str, nullable: bool = True) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"field {name!r} must be a finite number{' or null' if nullable else ''}")
    return float(value)


def _typed(value: Any, kind: type, name: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {name!r} must be {kind.__name__} or null")
    return value


def from_export_dict(data: Any) -> StoredRollout:
    """Validate one JSONL object (api shape plus meta["train"]); ValueError names the field."""
    rollout = rollout_from_dict(data)
    meta = dict(rollout.meta)
    train = meta.pop(TRAIN_KEY, {})
    if not isinstance(train, dict):
        raise ValueError("field 'meta.train' must be an object")
    unknown = sorted(set(train) - set(TRAIN_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) in 'meta.train': {', '.join(unknown)}")
    comps = train.get("reward_components") or {}
    if not isinstance(comps, dict):
        raise ValueError("field 'meta.train.reward_components' must be an object")
    components = {
        k: _number(v, f"meta.train.reward_components.{k}", nullable=False) for k, v in comps.items()
    }
    p = "meta.train."
    return StoredRollout(
        rollout=replace(rollout, meta=meta),
        reward_components=components,
        reward=_number(train.get("reward"), p + "reward"),
        advantage=_number(train.get("advantage"), p + "advantage"),
        kept=_typed(train.get("kept"), bool, p + "kept"),
        model_version=_typed(train.get("model_version"), str, p + "model_version"),
        seed=_typed(train.get("seed"), int, p + "seed"),
        harness_version=_typed(train.get("harness_version"), str, p + "harness_version"),
        step=_typed(train.get("step"), int, p + "step"),
    )


def export_jsonl(store: Store, out: TextIO, *, on_row: Callable[[], None] | None = None,
                 **filters: Any) -> int:
    """Write the selected rollouts, one per line, in store order; returns the count."""
    n = 0
    for sr in store.iter_rollouts(**filters):
        out.write(dumps(sr) + "\n")
        n += 1
        if on_row:
            on_row()
    return n


def _lines(source: TextIO) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line


def _parse(line: str) -> StoredRollout:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    return from_export_dict(data)


def import_jsonl(store: Store, source: Path | str | TextIO, *, skip_bad: bool = False
                 ) -> ImportSummary:
    """Validate every line, then store all of them in one transaction, or none.

    Two passes over the file keep memory to the set of ids; a stream that cannot seek
    (stdin) is read into memory first. With `skip_bad`, good lines are stored and the bad
    ones returned; without it any bad line raises ImportErrors and nothing is stored.
    """
    if isinstance(source, (str, Path)):
        with open(source, encoding="utf-8") as f:
            return import_jsonl(store, f, skip_bad=skip_bad)
    if not source.seekable():
        source = io.StringIO(source.read())

    errors: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for number, line in _lines(source):
        try:
            rid = _parse(line).rollout.id
        except ValueError as exc:
            errors.append((number, str(exc)))
            continue
        if rid in first_line:
            errors.append((number, f"duplicate id {rid!r} (first on line {first_line[rid]})"))
        else:
            first_line[rid] = number
    for rid in store.existing_ids(first_line):
        errors.append((first_line.pop(rid), f"id {rid!r} is already in the store"))
    errors.sort()
    if errors and not skip_bad:
        raise ImportErrors(errors)

    good = set(first_line.values())
    source.seek(0)
    imported = store.add_rollouts(_parse(line) for n, line in _lines(source) if n in good)
    return ImportSummary(imported=imported, skipped=errors)
