"""JSONL export and import of stored rollouts, in the public `api.rollout_to_dict` shape."""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO, cast, overload

from sqlalchemy.exc import DBAPIError, IntegrityError

from evotrainer.api import rollout_from_dict, rollout_to_dict
from evotrainer.errors import EvotrainerError, UserError
from evotrainer.store import line_checks
from evotrainer.store.store import Store, StoredRollout

# The store-only fields, carried in meta["train"] so the line stays a valid api rollout.
TRAIN_KEY = "train"
TRAIN_FIELDS = ("reward_components", "reward", "advantage", "kept", "model_version", "seed",
                "harness_version", "step")


@dataclass(frozen=True)
class ImportSummary:
    imported: int
    skipped: list[tuple[int, str]]


class ImportErrors(UserError):
    """A JSONL file had bad lines and nothing was stored; `errors` holds (line, message)."""

    def __init__(self, errors: list[tuple[int, str]]):
        self.errors = errors
        super().__init__(f"{len(errors)} bad line(s); first: line {errors[0][0]}: {errors[0][1]}")


class ImportRefused(EvotrainerError):
    """The database refused the import; its transaction rolled back, so nothing was stored.

    `kind` and `message` are the driver's error class and the first line of its message: never
    the SQL or the values, which hold what the file holds."""

    def __init__(self, error: DBAPIError):
        self.kind = type(error.orig).__name__
        self.message = (str(error.orig).strip().splitlines() or [""])[0]
        super().__init__(f"{self.kind}: {self.message}")


def add_or_refuse(store: Store, rows: list[StoredRollout]) -> int:
    """Store `rows` in one transaction; a refusal of the database is ImportRefused (rolled back
    whole, said without its SQL or values)."""
    try:
        return store.add_rollouts(rows)
    except DBAPIError as exc:
        raise ImportRefused(exc) from exc


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


@overload
def _number(value: Any, name: str, nullable: Literal[False]) -> float: ...
@overload
def _number(value: Any, name: str, nullable: bool = True) -> float | None: ...
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


def parse_line(raw: bytes | None) -> StoredRollout:
    """One JSONL line as `rollouts import` takes it (ValueError naming the field otherwise)."""
    sr = from_export_dict(line_checks.parse(raw))
    line_checks.check_columns(sr)
    return sr


def _binary(source: Path | str | TextIO | BinaryIO) -> tuple[BinaryIO, bool]:
    """A seekable byte stream of the source, and whether we opened it (and must close it)."""
    if isinstance(source, (str, Path)):
        return open(source, "rb"), True
    if isinstance(source, io.TextIOBase):
        buffer: BinaryIO | None = getattr(source, "buffer", None)
        if buffer is None:  # an in-memory text stream: lone surrogates stay invalid bytes
            return io.BytesIO(source.read().encode("utf-8", "surrogatepass")), True
        source = buffer
    source = cast(BinaryIO, source)  # a text stream is an io.TextIOBase: swapped for its bytes above
    if source.seekable():
        return source, False
    # stdin: spooled to disk past 64 MiB, so a big import does not sit in memory
    spool = tempfile.SpooledTemporaryFile(max_size=64 * 2**20)
    shutil.copyfileobj(source, spool, 2**20)
    spool.seek(0)
    return cast(BinaryIO, spool), True


def import_jsonl(store: Store, source: Path | str | TextIO | BinaryIO, *, skip_bad: bool = False
                 ) -> ImportSummary:
    """Validate every line, then store all of them in one transaction, or none.

    Two passes over the file keep memory to the set of ids. With `skip_bad`, good lines are
    stored and the bad ones returned; without it any bad line raises ImportErrors and nothing
    is stored. Messages name the line and field, never what the file holds (line_checks).
    Another import that stores the same ids first (two imports of one file at once) makes
    those lines "already in the store": this one stores nothing (or, with `skip_bad`, the rest).
    Any other refusal of the database raises ImportRefused, with nothing stored.
    """
    stream, owned = _binary(source)
    try:
        return _import(store, stream, skip_bad)
    except DBAPIError as exc:
        raise ImportRefused(exc) from exc
    finally:
        if owned:
            stream.close()


def _again(source: BinaryIO, good: set[int]) -> Iterator[StoredRollout]:
    """The second pass: the lines that passed the first, parsed again."""
    for number, raw in line_checks.lines(source):
        if number in good:
            try:
                yield parse_line(raw)
            except ValueError:  # raised inside the store's transaction: it rolls back whole
                raise ImportErrors([(number, "the file changed during the import")]) from None


def _import(store: Store, source: BinaryIO, skip_bad: bool) -> ImportSummary:
    errors: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    for number, raw in line_checks.lines(source):
        try:
            rid = parse_line(raw).rollout.id
        except ValueError as exc:
            errors.append((number, line_checks.no_content(str(exc))))
            continue
        if rid in first_line:
            errors.append((number, f"duplicate id (first on line {first_line[rid]})"))
        else:
            first_line[rid] = number
    while True:
        for rid in store.existing_ids(first_line):
            errors.append((first_line.pop(rid), "the id is already in the store"))
        errors.sort()
        if errors and not skip_bad:
            raise ImportErrors(errors)
        source.seek(0)
        try:
            imported = store.add_rollouts(_again(source, set(first_line.values())))
        except IntegrityError:
            # Another writer stored some of these ids after our check; our transaction rolled
            # back whole. Check again: those lines are now "already in the store".
            if not store.existing_ids(first_line):
                raise
            continue
        return ImportSummary(imported=imported, skipped=errors)
