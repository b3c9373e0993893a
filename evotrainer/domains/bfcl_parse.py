"""Read function calls out of a model's text with Python's `ast` parser only: nothing is evaluated.

The reading rule (the one docs/domains-bfcl.md states):
1. Strip the text. If it holds a closed ``` fence, read the last fenced block instead (an unclosed
   fence at the end: what follows it). Backticks left at either end are stripped too.
2. Parse that text as one Python expression (`mode="eval"`); if it does not parse, parse the
   span from its first `[` to its last `]` (a call list with prose around it).
3. The expression must be a call, or a list/tuple of calls (`[]` is zero calls). Anything else
   holds no calls. A list with both calls and other things is malformed.
4. A call's name is a dotted chain of plain names (`math.hypot`). Its arguments are keywords
   only, each named once; values are built from str/int/float/bool/None constants, unary minus on
   a number, lists, tuples and dicts with constant keys. Any other node (a name, a nested call, an
   f-string, an operator, `**kw`, a positional argument) makes the calls malformed, and a `__dunder__`
   name anywhere (`__import__`, `__class__`) is `tampering`.

BFCL's own decoder evaluates parts of model output with `eval`; this module is written from its
documented behaviour and never runs model text. Size and depth are bounded before and during the
walk, so no string makes the reader raise or take long.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

MAX_CHARS = 20_000  # far above any gold answer (the longest is under 1,000 characters)
MAX_DEPTH = 12  # nesting of values inside one argument; gold answers nest 3 deep at most
MAX_CALLS = 64
MAX_NODES = 4_000

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[^\n`]*\n((?:(?!```).)*)\Z", re.S)


@dataclass(frozen=True)
class Call:
    """One parsed call: a dotted name and its keyword arguments as plain Python values."""

    name: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Parsed:
    """What a text holds. `calls` is None when no call list could be read.

    `shaped` says the text looked like calls (a call at the top level) even when they are
    malformed: for irrelevance that is an attempted call. `error` names why calls are None or
    malformed: no_calls, syntax_error, too_long, too_deep, too_many_calls, mixed_list,
    bad_name, positional_arg, star_kwargs, duplicate_kwarg, bad_value:<Node>, dunder.
    """

    calls: list[Call] | None
    shaped: bool = False
    error: str | None = None
    flags: tuple[str, ...] = field(default_factory=tuple)


class _Malformed(Exception):
    pass


def _candidate_text(completion: str) -> str:
    text = completion.strip()
    blocks = _FENCE.findall(text)
    if blocks:
        text = blocks[-1]
    else:
        tail = _OPEN_FENCE.search(text)
        if tail:
            text = tail.group(1)
    return text.strip().strip("`").strip()


def _parse_expr(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _is_call_shaped(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        return True
    return isinstance(node, (ast.List, ast.Tuple)) and any(isinstance(e, ast.Call) for e in node.elts)


def _scan(node: ast.AST) -> str | None:
    """One pass over the tree: "dunder" for a `__name__` anywhere (live_irrelevance documents
    `__book_meeting_room`: one leading `__` is a name, not a reach for internals), "too_long" past MAX_NODES."""
    for count, sub in enumerate(ast.walk(node)):
        if count > MAX_NODES:
            return "too_long"
        name = getattr(sub, "id", None) or getattr(sub, "attr", None) or getattr(sub, "arg", None)
        if isinstance(name, str) and len(name) > 4 and name.startswith("__") and name.endswith("__"):
            return "dunder"
    return None


def _dotted(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise _Malformed("bad_name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _value(node: ast.expr, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _Malformed("too_deep")
    if isinstance(node, ast.Constant):
        if node.value is None or type(node.value) in (str, int, float, bool):
            return node.value
        raise _Malformed(f"bad_value:{type(node.value).__name__}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        if isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float)) and type(inner.value) is not bool:
            return -inner.value
        raise _Malformed("bad_value:UnaryOp")
    if isinstance(node, ast.List):
        return [_value(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, depth + 1) for e in node.elts)
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values):
            if k is None:  # {**other}
                raise _Malformed("bad_value:DictUnpack")
            key = _value(k, depth + 1)
            if not isinstance(key, (str, int, float, bool)) or key in out:
                raise _Malformed("bad_value:DictKey")
            out[key] = _value(v, depth + 1)
        return out
    raise _Malformed(f"bad_value:{type(node).__name__}")


def _call(node: ast.Call) -> Call:
    name = _dotted(node.func)
    if node.args:
        raise _Malformed("positional_arg")
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _Malformed("star_kwargs")
        if kw.arg in kwargs:
            raise _Malformed("duplicate_kwarg")
        kwargs[kw.arg] = _value(kw.value, 1)
    return Call(name, kwargs)


def parse_calls(completion: str) -> Parsed:
    """The calls a completion holds, read by the rule in this module's docstring. Never raises."""
    if not isinstance(completion, str):
        return Parsed(None, error="no_calls")
    if len(completion) > 4 * MAX_CHARS:  # before any regex: a long text is never read
        return Parsed(None, error="too_long")
    text = _candidate_text(completion)
    if len(text) > MAX_CHARS:
        return Parsed(None, error="too_long")
    node = _parse_expr(text)
    if node is None or not (_is_call_shaped(node) or _empty_list(node)):
        start, end = text.find("["), text.rfind("]")
        inner = _parse_expr(text[start:end + 1]) if 0 <= start < end else None
        if inner is not None and (_is_call_shaped(inner) or _empty_list(inner)):
            node = inner
        elif node is None:
            return Parsed(None, error="syntax_error")
    if _empty_list(node):
        return Parsed([], shaped=False)
    if not _is_call_shaped(node):
        return Parsed(None, error="no_calls")
    problem = _scan(node)
    if problem:
        return Parsed(None, shaped=True, error=problem, flags=(problem,) if problem == "dunder" else ())
    elts = [node] if isinstance(node, ast.Call) else list(node.elts)  # type: ignore[attr-defined]
    if len(elts) > MAX_CALLS:
        return Parsed(None, shaped=True, error="too_many_calls")
    if not all(isinstance(e, ast.Call) for e in elts):
        return Parsed(None, shaped=True, error="mixed_list")
    try:
        calls = [_call(e) for e in elts if isinstance(e, ast.Call)]
    except _Malformed as exc:
        return Parsed(None, shaped=True, error=str(exc))
    except (RecursionError, MemoryError):
        return Parsed(None, shaped=True, error="too_deep")
    return Parsed(calls, shaped=True)


def _empty_list(node: ast.expr | None) -> bool:
    return isinstance(node, (ast.List, ast.Tuple)) and not node.elts


def render_value(value: Any) -> str:
    """Python literal text for a plain value (the gold answers' spelling); parse_calls reads it back."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{render_value(k)}: {render_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(render_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def render_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """`[name(k=v, ...), ...]`: BFCL's prompting format."""
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={render_value(v)}' for k, v in kwargs.items())})"
                           for name, kwargs in calls) + "]"
