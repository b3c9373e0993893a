"""Hidden assert tests turned into (call, check) pairs: the call runs in the sandbox, the check here.

An MBPP test `assert f(3) == 9` or a HumanEval `def check(candidate): assert candidate(3) == 9`
becomes the call `f(3)` (source text, evaluated in the solution's sandboxed process, which
returns the value as plain data) and the check `<slot 0> == 9`, evaluated in the trusted process
by a small interpreter over decoded builtin values only. The expected side never enters the
sandbox, and no object the solution made takes part in a comparison.

The interpreter knows literals, comparisons, `and`/`or`/`not`, arithmetic on numbers (no `**`),
subscripts and a few pure builtins (`set`, `sorted`, `abs`, `round`, `len`, `math.isclose`, ...).
A test outside that (loops, helpers, local variables, the function used other than by calling
it) is not converted: `convert` returns None and the checker replays the whole test instead (see
code_check.py).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from evotrainer.errors import EvotrainerError

_FUNCS: dict[str, Any] = {
    "set": set, "frozenset": frozenset, "sorted": sorted, "list": list, "tuple": tuple, "dict": dict,
    "abs": abs, "round": round, "len": len, "str": str, "int": int, "float": float, "bool": bool,
    "sum": sum, "min": min, "max": max, "all": all, "any": any, "isclose": math.isclose,
}
_MATH = {"isclose": math.isclose, "fabs": math.fabs, "isnan": math.isnan, "isinf": math.isinf}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_NUMBER = (bool, int, float, complex)
RAISED = object()  # the value of a call that raised in the sandbox: using it fails the assert


@dataclass(frozen=True)
class Check:
    """One assert: the calls the sandbox evaluates, and the test evaluated here over their values."""

    calls: tuple[str, ...]
    test: ast.expr
    slots: tuple[int, ...]  # id() of each call node inside `test`, in the order of `calls`


@dataclass(frozen=True)
class Plan:
    """A test program's checks and the setup source the sandbox runs before each call."""

    checks: tuple[Check, ...]
    setup: str
    alias: str  # the name the calls use for the function (`candidate` in HumanEval)


class NotConvertible(EvotrainerError):
    """The test uses something the trusted interpreter does not evaluate."""


@lru_cache(maxsize=4096)
def convert(program: str, entry: str, setup: str = "") -> Plan | None:
    """The plan for one hidden test program (an MBPP assert or a HumanEval check module), or None."""
    try:
        tree = ast.parse(program)
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert):  # MBPP: one assert line
            return Plan((_check(tree.body[0].test, {entry}, program),), setup, entry)
        return _humaneval(tree, program, entry, setup)
    except (SyntaxError, ValueError, RecursionError, NotConvertible):
        return None


def _humaneval(tree: ast.Module, program: str, entry: str, setup: str) -> Plan:
    """`def check(candidate): assert ...` plus imports/constants, ending in `check(entry)`."""
    *head, last = tree.body
    call = last.value if isinstance(last, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and len(call.args) == 1
            and not call.keywords and isinstance(call.args[0], ast.Name) and call.args[0].id == entry):
        raise NotConvertible("no final check(entry) call")
    checks: list[Check] = []
    kept: list[str] = []
    found = False
    for stmt in head:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == call.func.id:
            args = stmt.args
            if found or len(args.args) != 1 or args.vararg or args.kwarg or args.kwonlyargs or stmt.decorator_list:
                raise NotConvertible("check() is not a one-argument function")
            found = True
            names = {entry, args.args[0].arg}
            for inner in stmt.body:
                if isinstance(inner, ast.Assert):
                    checks.append(_check(inner.test, names, program))
                elif isinstance(inner, (ast.Import, ast.ImportFrom)):  # `import math` inside check()
                    kept.append(ast.get_source_segment(program, inner) or "")
                elif not (isinstance(inner, (ast.Pass, ast.Expr)) and _is_constant_stmt(inner)):
                    raise NotConvertible(f"check() holds a {type(inner).__name__}")
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)) or _is_constant_stmt(stmt):
            kept.append(ast.get_source_segment(program, stmt) or "")
        else:
            raise NotConvertible(f"module holds a {type(stmt).__name__}")
    if not found or not checks:
        raise NotConvertible("no asserts in check()")
    alias = next(s.args.args[0].arg for s in head if isinstance(s, ast.FunctionDef) and s.name == call.func.id)
    return Plan(tuple(checks), "\n".join(x for x in [setup, *kept] if x.strip()), alias)


def _is_constant_stmt(stmt: ast.stmt) -> bool:
    """`pass`, a docstring, or `NAME = <literal>` (HumanEval's METADATA)."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        try:
            ast.literal_eval(stmt.value)
            return True
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return False
    return False


def _check(test: ast.expr, names: set[str], program: str) -> Check:
    calls: list[str] = []
    slots: list[int] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            source = ast.get_source_segment(program, node)
            if source is None:
                raise NotConvertible("no source for a call")
            calls.append(source)
            slots.append(id(node))
            return
        if isinstance(node, ast.Name):
            raise NotConvertible(f"name {node.id!r} outside a call")
        if isinstance(node, ast.Call):
            if node.func.__class__ is ast.Name and node.func.id in _FUNCS:
                pass
            elif (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == "math" and node.func.attr in _MATH):
                pass
            else:
                raise NotConvertible("call of something other than the function or a known builtin")
            for child in [*node.args, *(k.value for k in node.keywords)]:
                walk(child)
            if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
                raise NotConvertible("star arguments")
            return
        if not isinstance(node, _NODES):
            raise NotConvertible(type(node).__name__)
        if isinstance(node, ast.BinOp) and type(node.op) not in _BIN:
            raise NotConvertible(type(node.op).__name__)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(test)
    return Check(tuple(calls), test, tuple(slots))


_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare,
          ast.Subscript, ast.Slice, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)


def holds(check: Check, values: Sequence[Any]) -> bool:
    """Whether the assert holds for the decoded call values; any error in the check is a failure."""
    by_slot = dict(zip(check.slots, values))
    try:
        return bool(_eval(check.test, by_slot))
    except Exception:
        return False


def _eval(node: ast.AST, slots: dict[int, Any]) -> Any:
    if id(node) in slots:
        if slots[id(node)] is RAISED:
            raise RuntimeError("the call raised")
        return slots[id(node)]
    ev = lambda n: _eval(n, slots)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [ev(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(ev(e) for e in node.elts)
    if isinstance(node, ast.Set):
        return {ev(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {ev(k): ev(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        value = ev(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        _numbers(value)
        return -value if isinstance(node.op, ast.USub) else +value if isinstance(node.op, ast.UAdd) else ~value
    if isinstance(node, ast.BinOp):
        left, right = ev(node.left), ev(node.right)
        _numbers(left, right)  # no `"a" * 10**9`: arithmetic only on numbers
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.BoolOp):
        result = True if isinstance(node.op, ast.And) else False
        for value in node.values:
            result = ev(value)
            if isinstance(node.op, ast.And) != bool(result):
                return result
        return result
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = ev(comp)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript):
        return ev(node.value)[ev(node.slice)]
    if isinstance(node, ast.Slice):
        return slice(*(None if p is None else ev(p) for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Call):
        fn = _MATH[node.func.attr] if isinstance(node.func, ast.Attribute) else _FUNCS[node.func.id]
        return fn(*[ev(a) for a in node.args], **{k.arg: ev(k.value) for k in node.keywords})
    raise NotConvertible(type(node).__name__)


def _numbers(*values: Any) -> None:
    if not all(type(v) in _NUMBER for v in values):
        raise TypeError("arithmetic on a non-number")
