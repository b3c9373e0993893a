"""What one imported JSONL line may be before it reaches the store: size, text, nesting, columns.

A rollouts file may come from anywhere, so each check names the line and the field and never
echoes what the file holds (a file given by mistake, such as a credentials file, must not be
printed back): messages carry our own field names (`_KNOWN`); any other name from the file
is `<name>`, any value `<value>`, but for an unknown field that is a likely typo of ours.

- A line is at most MAX_LINE_BYTES (8 MiB) of UTF-8; a longer one is skipped unread.
- JSON nests at most MAX_DEPTH (100) levels; json's own recursion limit is far above any
  honest rollout and its RecursionError is turned into the same message.
- Every string (keys included) is valid Unicode: JSON escapes can spell lone surrogates
  ("\\ud800"), which no UTF-8 database column can hold.
- Identifiers (id, task_id, group_id, domain, model_version, harness_version) are non-empty
  where required, hold no control characters (NUL included) and fit their column.
- Integers fit their column: 32-bit for Integer, 64-bit for BigInteger.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from sqlalchemy import BigInteger

from evotrainer.api import _ROLLOUT_FIELDS
from evotrainer.store.models import RolloutRow
from evotrainer.store.store import StoredRollout

MAX_LINE_BYTES = 8 * 2**20
MAX_DEPTH = 100
_READ = 2**20
# Every name a rollout line may use: what a message may repeat back from the file.
_KNOWN = frozenset({*_ROLLOUT_FIELDS, "turns", "outcome", "meta", "role", "content", "success", "score",
                    "kind", "flags", "train", "reward_components", "reward", "advantage", "kept",
                    "model_version", "seed", "harness_version", "step"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUOTED = re.compile(r"""(?P<lead>\bfield |\bfields? in |\bmissing field )?(?P<q>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_LISTED = re.compile(r"^(?P<head>unknown (?:outcome )?field\(s\)(?: in '[^']*')?: )(?P<names>.*)$")
_COLUMNS = RolloutRow.__table__.c
_IDENTIFIERS = {"id": True, "task_id": True, "group_id": True, "domain": True,
                "model_version": False, "harness_version": False}  # name -> required


def lines(source: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, raw bytes) of every non-blank line; None for a line over MAX_LINE_BYTES,
    which is skipped without being held in memory."""
    number = 0
    while True:
        raw = source.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = source.readline(_READ)
            yield number, None
        elif raw.strip():
            yield number, raw


def parse(raw: bytes | None) -> Any:
    """The JSON value of one line; ValueError says what is wrong without quoting the line."""
    if raw is None:
        raise ValueError(f"the line is longer than {MAX_LINE_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte {exc.start + 1} of the line)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # e.g. an integer of more digits than Python converts
        raise ValueError("invalid JSON: a number too long to read") from None
    _walk(data)
    return data


def _walk(data: Any) -> None:
    """Depth and Unicode of every value, iteratively (no recursion for a hostile nesting)."""
    stack = [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _text(key, f"{path}.{key}" if path else key, is_key=True)
                    where = f"{path}.{key}" if path else key
                else:
                    where = f"{path}[{key}]"
                stack.append((item, depth + 1, where))
        elif isinstance(value, str):
            _text(value, path)


def _text(value: str, path: str, is_key: bool = False) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        what = "a key" if is_key else f"field {_shown(path)}"
        raise ValueError(f"{what} holds a lone surrogate escape (\\ud800-\\udfff), not valid Unicode") from None


def _shown(path: str) -> str:
    """A field path as a message shows it: our field names stay, any other part is <name>."""
    parts = re.split(r"[.\[\]]+", path.strip("[]"))
    return repr(".".join(p if p in _KNOWN or p.isdigit() else "<name>" for p in parts))


def check_columns(sr: StoredRollout) -> None:
    """Identifiers and integers that the store's columns can hold as they are."""
    r = sr.rollout
    values = {"id": r.id, "task_id": r.task_id, "group_id": r.group_id, "domain": r.domain,
              "model_version": sr.model_version, "harness_version": sr.harness_version}
    for name, required in _IDENTIFIERS.items():
        value = values[name]
        if value is None:
            continue
        field = name if name in ("id", "task_id", "group_id", "domain") else f"meta.train.{name}"
        if required and not value.strip():
            raise ValueError(f"field {field!r} must not be empty")
        if _CONTROL.search(value):
            raise ValueError(f"field {field!r} holds a control character (such as NUL)")
        limit = _COLUMNS[name].type.length  # type: ignore[attr-defined]  # a String column; stubs: TypeEngine
        if len(value) > limit:
            raise ValueError(f"field {field!r} is {len(value)} characters, over the store's {limit}")
    for name, number in (("num_tokens", r.num_tokens), ("step", sr.step), ("seed", sr.seed)):
        if number is None:
            continue
        bits = 64 if isinstance(_COLUMNS[name].type, BigInteger) else 32
        if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
            field = name if name == "num_tokens" else f"meta.train.{name}"
            raise ValueError(f"field {field!r} is out of range for the store (a {bits}-bit integer)")


def no_content(message: str) -> str:
    """A validation message with every value quoted from the file replaced by <value>: our
    field names stay, and an unknown field's name only when it is a likely typo of one."""
    match = _LISTED.match(message)
    if match:
        names = [n if difflib.get_close_matches(n, _KNOWN, 1, 0.75) else "<name>"
                 for n in match["names"].split(", ")]
        return match["head"] + ", ".join(names)

    def keep(m: re.Match) -> str:
        return (m["lead"] + _shown(m["q"][1:-1])) if m["lead"] else "<value>"

    return _QUOTED.sub(keep, message)


__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "check_columns", "lines", "no_content", "parse"]
