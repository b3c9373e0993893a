"""BFCL's AST check, written from the benchmark's documented rules: calls against ground-truth allowed values.

A ground-truth entry is `{function_name: {param: [allowed, ...]}}`; a call matches it when
- the names are equal (exactly: the prompt shows dotted names and Python call syntax spells them),
- every parameter the function's docs require is given, none is unknown to the docs or to the entry,
  and a parameter of the entry that is left out has "" among its allowed values,
- every given value equals one allowed value (`same`), which also checks its type against the docs.
Equality follows BFCL: strings compare after lowercasing and deleting spaces and `,./-_*^` (and `'`
reads as `"`); an int is accepted for a float; a tuple reads as a list; a bool is never a number.
A dict-typed value is checked key by key against an allowed dict whose values are lists of
allowed values, recursively (BFCL stops at one level; the data has deeper ones). A list of such
dicts is checked item by item, in order.

Several calls (parallel categories) succeed only when the counts are equal and there is a
one-to-one matching of calls to entries (a maximum bipartite matching, so order never matters and
one call cannot count twice). The score is matched / max(#calls, #entries).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from evotrainer.domains.bfcl_parse import Call

_TYPE_ALIASES = {"number": "float", "double": "float", "object": "dict", "list": "array", "str": "string",
                 "int": "integer", "bool": "boolean", "": "any"}
_STRIP = re.compile(r"[ ,./\-_*^]")


def type_of(schema: Mapping[str, Any] | None) -> str:
    t = schema.get("type") if isinstance(schema, Mapping) else None
    return _TYPE_ALIASES.get(t, t) if isinstance(t, str) else "any"


def norm(s: str) -> str:
    """BFCL's string standardization: 'April 1, 2024' and 'april 1 2024' read alike."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def _is_num(v: Any) -> bool:
    return type(v) in (int, float)


def _items(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    items = schema.get("items")
    return items if isinstance(items, Mapping) else {}


def _prop(schema: Mapping[str, Any], key: Any) -> Mapping[str, Any]:
    props = schema.get("properties")
    sub = props.get(key) if isinstance(props, Mapping) else None
    return sub if isinstance(sub, Mapping) else {}


def conforms(value: Any, schema: Mapping[str, Any], depth: int = 0) -> bool:
    """Whether a value has the type its docs declare (with BFCL's int-for-float leniency)."""
    if depth > 32:
        return False
    t = type_of(schema)
    if t == "any":
        return True
    if value is None:  # a null is a value only where the docs give it as the default
        return "default" in schema and schema["default"] is None
    if t == "string":
        return type(value) is str
    if t == "integer":
        return type(value) is int
    if t == "float":
        return _is_num(value)
    if t == "boolean":
        return type(value) is bool
    if t in ("array", "tuple"):
        return isinstance(value, (list, tuple)) and all(conforms(v, _items(schema), depth + 1) for v in value)
    if t == "dict":
        return isinstance(value, dict) and all(conforms(v, _prop(schema, k), depth + 1) for k, v in value.items())
    return True  # a type name the docs made up: nothing to hold the value to


def is_allowed_form(option: Any) -> bool:
    """An allowed dict in ground-truth form: every value is a list of allowed values."""
    return isinstance(option, dict) and all(isinstance(v, list) for v in option.values())


def same(value: Any, option: Any, schema: Mapping[str, Any], depth: int = 0) -> bool:
    """Whether a model's value equals one allowed value, under BFCL's leniencies. Never raises."""
    if depth > 32 or not conforms(value, schema):
        return False
    t = type_of(schema)
    if isinstance(value, str) or isinstance(option, str):
        return isinstance(value, str) and isinstance(option, str) and norm(value) == norm(option)
    if isinstance(value, bool) or isinstance(option, bool) or value is None or option is None:
        return type(value) is type(option) and value == option
    if _is_num(value) or _is_num(option):
        return _is_num(value) and _is_num(option) and value == option
    if isinstance(value, (list, tuple)):
        item = _items(schema)
        return (isinstance(option, (list, tuple)) and len(value) == len(option)
                and all(same(v, o, item, depth + 1) for v, o in zip(value, option)))
    if isinstance(value, dict):
        if not isinstance(option, dict):
            return False
        if is_allowed_form(option) and t in ("dict", "any"):
            return dict_matches(value, option, schema, depth + 1)
        return (set(value) == set(option)
                and all(same(value[k], option[k], _prop(schema, k), depth + 1) for k in value))
    return False


def dict_matches(value: dict, allowed: Mapping[str, list], schema: Mapping[str, Any], depth: int = 0) -> bool:
    """A dict against {key: [allowed values]}: no unknown key, each value allowed, omitted keys allow ""."""
    for k, v in value.items():
        if k not in allowed or not any(same(v, a, _prop(schema, k), depth) for a in allowed[k]):
            return False
    return all(k in value or "" in options for k, options in allowed.items())


def _param_matches(value: Any, allowed: Sequence[Any], schema: Mapping[str, Any]) -> bool:
    return any(same(value, a, schema) for a in allowed)


def call_matches(call: Call, entry: Mapping[str, Mapping[str, list]], docs: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether one call satisfies one ground-truth entry, with the function's docs."""
    ((name, allowed),) = entry.items()
    doc = docs.get(name)
    if call.name != name or doc is None:
        return False
    params = doc.get("parameters") or {}
    props = params.get("properties") or {}
    if any(r not in call.kwargs for r in params.get("required") or ()):
        return False
    for key, value in call.kwargs.items():
        if key not in props or key not in allowed or not _param_matches(value, allowed[key], props[key]):
            return False
    return all(key in call.kwargs or "" in options for key, options in allowed.items())


def max_matching(n_left: int, n_right: int, edge: Any) -> int:
    """Size of a maximum bipartite matching (augmenting paths; both sides are small)."""
    match_of_right: list[int | None] = [None] * n_right

    def augment(i: int, seen: list[bool]) -> bool:
        for j in range(n_right):
            if edge(i, j) and not seen[j]:
                seen[j] = True
                other = match_of_right[j]
                if other is None or augment(other, seen):
                    match_of_right[j] = i
                    return True
        return False

    return sum(1 for i in range(n_left) if augment(i, [False] * n_right))


def match_calls(calls: Sequence[Call], ground_truth: Sequence[Mapping[str, Mapping[str, list]]],
                docs: Mapping[str, Mapping[str, Any]]) -> int:
    """How many calls can be paired one-to-one with entries they satisfy."""
    table = [[call_matches(c, e, docs) for e in ground_truth] for c in calls]
    return max_matching(len(calls), len(ground_truth), lambda i, j: table[i][j])


def valid_against_docs(call: Call, docs: Mapping[str, Mapping[str, Any]]) -> bool:
    """A call a function's docs accept: documented name, required params, no unknown ones, right types."""
    doc = docs.get(call.name)
    if doc is None:
        return False
    params = doc.get("parameters") or {}
    props = params.get("properties") or {}
    if any(r not in call.kwargs for r in params.get("required") or ()):
        return False
    return all(k in props and conforms(v, props[k]) for k, v in call.kwargs.items())


# ---------------------------------------------------------------- gold answers and the data audit


def gold_value(allowed: Sequence[Any], schema: Mapping[str, Any]) -> tuple[bool, Any]:
    """(found, the first allowed value that conforms to the docs), dicts rebuilt from allowed form."""
    for option in allowed:
        if option == "":
            continue
        value = _literal(option, schema)
        if conforms(value, schema) and same(value, option, schema):
            return True, value
    return False, None


def _literal(option: Any, schema: Mapping[str, Any]) -> Any:
    t = type_of(schema)
    if isinstance(option, dict) and is_allowed_form(option) and t in ("dict", "any"):
        out = {}
        for k, options in option.items():
            if "" in options:
                continue
            found, v = gold_value(options, _prop(schema, k))
            out[k] = v if found else (options[0] if options else None)
        return out
    if isinstance(option, list) and t in ("array", "tuple"):
        return [_literal(o, _items(schema)) for o in option]
    return option


def gold_calls(ground_truth: Sequence[Mapping[str, Mapping[str, list]]], docs: Mapping[str, Mapping[str, Any]]
               ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(a gold call per entry, the reasons it cannot be right): first conforming allowed value per
    parameter, optional ones whose list holds "" left out."""
    calls: list[tuple[str, dict[str, Any]]] = []
    problems: list[str] = []
    for entry in ground_truth:
        ((name, allowed),) = entry.items()
        doc = docs.get(name)
        if doc is None:
            problems.append(f"{name}: no function of that name in the docs")
            calls.append((name, {}))
            continue
        params = doc.get("parameters") or {}
        props = params.get("properties") or {}
        required = list(params.get("required") or ())
        kwargs: dict[str, Any] = {}
        for key in required:
            if key not in allowed:
                problems.append(f"{name}.{key}: required by the docs, absent from the ground truth")
        for key, options in allowed.items():
            if key not in props:  # harmless when it may be left out: no answer can give it anyway
                if "" not in options:
                    problems.append(f"{name}.{key}: not a parameter in the docs")
                continue
            if "" in options and key not in required:
                continue
            found, value = gold_value(options, props[key])
            if not found:
                given = [o for o in options if o != ""]
                shown = ", ".join(repr(o) for o in given[:3])[:120]
                problems.append(f"{name}.{key}: no allowed value is a {type_of(props[key])} ({shown})" if given else
                                f"{name}.{key}: required by the docs, the ground truth allows no value "
                                f"({'only leaving it out' if options else 'an empty list'})")
                continue
            kwargs[key] = value
        calls.append((name, kwargs))
    return calls, problems
