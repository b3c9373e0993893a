"""Seeded AST mutations: inject one bug into a Python module as a minimal text edit.

Every mutation site is found on the AST, applied as a small edit of the source text (so the gold
patch is a one- or few-line diff, not a reformatted file) and then checked: the edited text must
parse to exactly the AST that the same mutation gives when applied to the tree. A site whose text
edit cannot be made exact (comments inside an expression, odd layouts) is skipped, never guessed.

Only code inside function bodies is mutated: a bug at module level usually breaks the import, and
then no test passes, which makes no task.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

KINDS = (
    "flip_compare",  # `<` -> `<=`, `==` -> `!=`, `in` -> `not in`, ...
    "flip_arith",  # `+` -> `-`, `*` -> `/`, `+=` -> `-=`, ...
    "off_by_one",  # an integer constant n -> n + 1 or n - 1
    "remove_condition",  # drop one operand of `and`/`or`, or `if cond:` -> `if True:`
    "remove_branch",  # delete an `else`/`elif` block, or a guard clause (`if x: return y`)
    "swap_operands",  # `a - b` -> `b - a`, `a < b` -> `b < a`
    "invert_if",  # `if c:` -> `if not (c):`
    "remove_assign",  # delete an assignment statement
    "break_loop",  # `continue` -> `break`, or a `break` at the end of a loop body
)


@dataclass(frozen=True)
class Mutation:
    """One injected bug in one file. `original` -> `mutated` is the bug; the reverse is the fix."""

    path: str  # repo-relative, '/'-separated
    kind: str
    lineno: int  # 1-based line of the mutation in the mutated file
    function: str  # qualified name of the enclosing function, e.g. "Stack.push"
    description: str
    original: str
    mutated: str

    @property
    def key(self) -> str:
        """Identity of the bug: two sites that produce the same file are one mutation."""
        return hashlib.sha256(f"{self.path}\0{self.mutated}".encode()).hexdigest()


# ---------------------------------------------------------------- sites


@dataclass
class _Site:
    kind: str
    node: ast.AST
    function: str
    parent: list | None = None  # the statement list that holds `node` (statement mutations)
    variant: int = 0


_CMP_FLIP: dict[type, type] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_CMP_TEXT: dict[type, str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_CMP_PATTERN: dict[type, str] = {
    ast.Lt: r"<(?!=)", ast.LtE: r"<=", ast.Gt: r">(?!=)", ast.GtE: r">=", ast.Eq: r"==",
    ast.NotEq: r"!=", ast.In: r"(?<!not )\bin\b", ast.NotIn: r"\bnot\s+in\b",
    ast.Is: r"\bis\b(?!\s+not\b)", ast.IsNot: r"\bis\s+not\b",
}
_ARITH_FLIP: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift,
    ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
}
_ARITH_TEXT: dict[type, str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|",
}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_TERMINAL = (ast.Return, ast.Raise, ast.Break, ast.Continue)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _statement_lists(node: ast.AST) -> Iterator[list]:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
    for handler in getattr(node, "handlers", []) or []:
        yield handler.body
    for case in getattr(node, "cases", []) or []:
        yield case.body


def find_sites(tree: ast.Module) -> list[_Site]:
    """Every mutation site inside function bodies, in a deterministic order (a pure function of
    the tree, so the same index finds the same site in a fresh parse)."""
    sites: list[_Site] = []

    def expressions(stmt: ast.stmt, function: str) -> None:
        # Expressions of this statement only; nested statements are visited by `block`.
        todo = [v for name, v in ast.iter_fields(stmt)
                if name not in ("body", "orelse", "finalbody", "handlers", "cases", "decorator_list")]
        stack: list = []
        for value in todo:
            stack.extend(value if isinstance(value, list) else [value])
        while stack:
            node = stack.pop(0)
            if not isinstance(node, ast.AST) or isinstance(node, (ast.stmt, ast.JoinedStr)):
                continue
            if isinstance(node, ast.Compare):
                sites.append(_Site("flip_compare", node, function))
                if len(node.ops) == 1 and isinstance(node.ops[0], _ORDER):
                    sites.append(_Site("swap_operands", node, function))
            elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_FLIP:
                if not (_is_text(node.left) or _is_text(node.right)):
                    sites.append(_Site("flip_arith", node, function))
                    if isinstance(node.op, _NONCOMMUTATIVE):
                        sites.append(_Site("swap_operands", node, function))
            elif isinstance(node, ast.BoolOp):
                for i in range(len(node.values)):
                    sites.append(_Site("remove_condition", node, function, variant=i))
            elif (isinstance(node, ast.Constant) and type(node.value) is int):
                sites.append(_Site("off_by_one", node, function))
            stack.extend(ast.iter_child_nodes(node))

    def block(stmts: list, function: str | None, in_loop: bool) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{function}.{stmt.name}" if function else stmt.name
                block(stmt.body, name, False)
                continue
            if isinstance(stmt, ast.ClassDef):
                if function:  # a class made at call time: its whole body runs as function code
                    block(stmt.body, f"{function}.{stmt.name}", False)
                else:
                    _class(stmt, stmt.name)
                continue
            if function is not None:
                _statement_sites(stmt, stmts, function, in_loop)
                expressions(stmt, function)
            loop = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
            for inner in _statement_lists(stmt):
                nested_loop = in_loop or (loop and inner is stmt.body)
                block(inner, function, nested_loop if function else False)

    def _class(cls: ast.ClassDef, qual: str) -> None:
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                block(stmt.body, f"{qual}.{stmt.name}", False)
            elif isinstance(stmt, ast.ClassDef):
                _class(stmt, f"{qual}.{stmt.name}")

    def _statement_sites(stmt: ast.stmt, parent: list, function: str, in_loop: bool) -> None:
        if isinstance(stmt, ast.If):
            sites.append(_Site("invert_if", stmt, function))
            if not (isinstance(stmt.test, ast.Constant)):
                sites.append(_Site("remove_condition", stmt, function, parent, variant=-1))
            if stmt.orelse:
                sites.append(_Site("remove_branch", stmt, function, parent, variant=1))
            elif len(parent) > 1 and len(stmt.body) == 1 and isinstance(stmt.body[0], _TERMINAL):
                sites.append(_Site("remove_branch", stmt, function, parent, variant=0))
        elif isinstance(stmt, (ast.Assign, ast.AugAssign)) or (isinstance(stmt, ast.AnnAssign) and stmt.value):
            sites.append(_Site("remove_assign", stmt, function, parent))
            if isinstance(stmt, ast.AugAssign) and type(stmt.op) in _ARITH_FLIP:
                sites.append(_Site("flip_arith", stmt, function))
        elif isinstance(stmt, ast.Continue) and in_loop:
            sites.append(_Site("break_loop", stmt, function))
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)) and not isinstance(stmt.body[-1], _TERMINAL):
            sites.append(_Site("break_loop", stmt, function, variant=1))

    block(tree.body, None, False)
    return sites


# ---------------------------------------------------------------- text positions


class _Text:
    """Source text with AST (line, byte column) positions turned into string offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip())]


Edit = tuple[int, int, str]  # replace source[start:end] with text


def _apply(source: str, edits: list[Edit]) -> str:
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _op_in_gap(text: _Text, left: ast.AST, right: ast.AST, pattern: str) -> tuple[int, int] | None:
    start, end = text.span(left)[1], text.span(right)[0]
    gap = text.source[start:end]
    if "#" in gap or "\\" in gap:
        return None
    found = list(re.finditer(pattern, gap))
    if len(found) != 1:
        return None
    return start + found[0].start(), start + found[0].end()


def _delete_lines(text: _Text, first: int, last: int) -> Edit:
    return text.line_start(first), text.starts[last], ""


def _owns_lines(text: _Text, stmt: ast.stmt) -> bool:
    """The statement alone fills its lines (no `a = 1; b = 2`, no code after it on the line)."""
    before = text.lines[stmt.lineno - 1].encode("utf-8")[: stmt.col_offset]
    after = text.lines[stmt.end_lineno - 1].encode("utf-8")[stmt.end_col_offset:].decode("utf-8", "replace")
    return not before.strip() and (not after.strip() or after.strip().startswith("#"))


# ---------------------------------------------------------------- one mutation: text edit + tree edit

TreeEdit = Callable[[_Site, ast.AST], None]  # the same change on a fresh tree's site
Made = tuple[list[Edit], str, TreeEdit] | None  # (text edits, description, tree edit)


def _mutate(site: _Site, text: _Text) -> Made:
    """(text edits, description, the same change on a fresh tree's site) or None when the
    site cannot be edited exactly."""
    make = _mutator(site)
    return make(site, text) if make is not None else None


def _mutator(site: _Site) -> Callable[[_Site, _Text], Made] | None:
    """The function that makes this site's mutation: one per kind, two for the kinds with two forms."""
    node, kind = site.node, site.kind
    if kind == "remove_condition":
        return _drop_operand if isinstance(node, ast.BoolOp) else _if_true
    if kind == "remove_branch":
        return _remove_else if site.variant == 1 else _remove_guard
    if kind == "break_loop":
        return _continue_to_break if isinstance(node, ast.Continue) else _break_at_loop_end
    return {"flip_compare": _flip_compare, "flip_arith": _flip_arith, "off_by_one": _off_by_one,
            "swap_operands": _swap_operands, "invert_if": _invert_if, "remove_assign": _remove_assign}.get(kind)


def _flip_compare(site: _Site, text: _Text) -> Made:
    node = site.node
    op = node.ops[0]
    new = _CMP_FLIP[type(op)]
    where = _op_in_gap(text, node.left, node.comparators[0], _CMP_PATTERN[type(op)])
    if where is None:
        return None

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.ops[0] = new()
    return [(*where, _CMP_TEXT[new])], f"'{_CMP_TEXT[type(op)]}' -> '{_CMP_TEXT[new]}'", tree


def _flip_arith(site: _Site, text: _Text) -> Made:
    node = site.node
    new = _ARITH_FLIP[type(node.op)]
    if isinstance(node, ast.AugAssign):
        repl = _ARITH_TEXT[new] + "="
        where = _op_in_gap(text, node.target, node.value, re.escape(_ARITH_TEXT[type(node.op)] + "="))
    else:
        repl = _ARITH_TEXT[new]
        where = _op_in_gap(text, node.left, node.right, _binop_pattern(node.op))
    if where is None:
        return None

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.op = new()
    return [(*where, repl)], f"'{text.source[where[0]:where[1]]}' -> '{repl}'", tree


def _binop_pattern(op: ast.operator) -> str:
    """The operator's text, where `*` and `/` must not be part of `**`, `//` or an `*=`."""
    pattern = re.escape(_ARITH_TEXT[type(op)])
    if _ARITH_TEXT[type(op)] in ("*", "/"):
        pattern = r"(?<![*/])" + pattern + r"(?![*/=])"
    return pattern


def _off_by_one(site: _Site, text: _Text) -> Made:
    node = site.node
    if text.segment(node) != str(node.value):
        return None
    delta = 1 if node.value == 0 or (node.lineno + node.col_offset) % 2 else -1
    value = node.value + delta

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.value = value
    return [(*text.span(node), str(value))], f"{node.value} -> {value}", tree


def _drop_operand(site: _Site, text: _Text) -> Made:
    """`a and b and c` without its operand number `site.variant`."""
    i, values = site.variant, site.node.values
    if i == 0:
        edit = (text.span(values[0])[0], text.span(values[1])[0], "")
    else:
        edit = (text.span(values[i - 1])[1], text.span(values[i])[1], "")
    dropped = text.segment(values[i])

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.values.pop(i)
        if len(s.node.values) == 1:
            _swap_child(root, s.node, s.node.values[0])
    return [edit], f"dropped condition `{_short(dropped)}`", tree


def _if_true(site: _Site, text: _Text) -> Made:
    """`if cond:` -> `if True:`."""
    node = site.node

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.test = ast.Constant(True)
    return [(*text.span(node.test), "True")], f"`if {_short(text.segment(node.test))}:` -> `if True:`", tree


def _swap_operands(site: _Site, text: _Text) -> Made:
    node = site.node
    left, right = (node.left, node.comparators[0]) if isinstance(node, ast.Compare) else (node.left, node.right)
    a, b = text.segment(left), text.segment(right)
    if a == b:
        return None
    (ls, le), (rs, re_) = text.span(left), text.span(right)
    gap = text.source[le:rs]

    def tree(s: _Site, root: ast.AST) -> None:
        if isinstance(s.node, ast.Compare):
            s.node.left, s.node.comparators[0] = s.node.comparators[0], s.node.left
        else:
            s.node.left, s.node.right = s.node.right, s.node.left
    return [(ls, re_, b + gap + a)], f"swapped `{_short(a)}` and `{_short(b)}`", tree


def _invert_if(site: _Site, text: _Text) -> Made:
    """`if c:` -> `if not (c):`, and `if not c:` -> `if c:`."""
    test = site.node.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = text.segment(test.operand)

        def unwrap(s: _Site, root: ast.AST) -> None:
            s.node.test = s.node.test.operand
        return [(*text.span(test), inner)], f"`not {_short(inner)}` -> `{_short(inner)}`", unwrap
    seg = text.segment(test)

    def negate(s: _Site, root: ast.AST) -> None:
        s.node.test = ast.UnaryOp(ast.Not(), s.node.test)
    return [(*text.span(test), f"not ({seg})")], f"`{_short(seg)}` -> `not ({_short(seg)})`", negate


def _remove_else(site: _Site, text: _Text) -> Made:
    """Drop the `else`/`elif` part of an `if`."""
    node = site.node
    first = node.orelse[0]
    head = text.lines[first.lineno - 1].lstrip()
    if len(node.orelse) == 1 and isinstance(first, ast.If) and head.startswith("elif"):
        start_line, what = first.lineno, "elif"
    else:
        start_line, what = _else_line(text, node), "else"
    if start_line is None or not _owns_lines(text, node.orelse[-1]):
        return None

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.orelse = []
    return [_delete_lines(text, start_line, node.orelse[-1].end_lineno)], f"removed the `{what}` branch", tree


def _else_line(text: _Text, node: ast.If) -> int | None:
    """The line of this `if`'s own `else:` (searched upward from the else body), if it has one."""
    for ln in range(node.orelse[0].lineno, node.body[-1].end_lineno, -1):
        if re.match(r"else\s*:", text.lines[ln - 1].lstrip()) and len(text.indent(ln)) == len(text.indent(node.lineno)):
            return ln
    return None


def _remove_guard(site: _Site, text: _Text) -> Made:
    """Delete a guard clause (`if x: return y`)."""
    node = site.node
    if not _owns_lines(text, node):
        return None
    index = site.parent.index(node)

    def tree(s: _Site, root: ast.AST) -> None:
        s.parent.pop(index)
    return [_delete_lines(text, node.lineno, node.end_lineno)], \
        f"removed `if {_short(text.segment(node.test))}: ...`", tree


def _remove_assign(site: _Site, text: _Text) -> Made:
    """Delete an assignment; the only statement of a block becomes `pass`."""
    node = site.node
    if not _owns_lines(text, node):
        return None
    index, description = site.parent.index(node), f"removed `{_short(text.segment(node))}`"
    if len(site.parent) == 1:
        def to_pass(s: _Site, root: ast.AST) -> None:
            s.parent[index] = ast.Pass()
        edit = (text.line_start(node.lineno), text.starts[node.end_lineno], text.indent(node.lineno) + "pass\n")
        return [edit], description, to_pass

    def delete(s: _Site, root: ast.AST) -> None:
        s.parent.pop(index)
    return [_delete_lines(text, node.lineno, node.end_lineno)], description, delete


def _continue_to_break(site: _Site, text: _Text) -> Made:
    def tree(s: _Site, root: ast.AST) -> None:
        _swap_child(root, s.node, ast.Break())
    return [(*text.span(site.node), "break")], "`continue` -> `break`", tree


def _break_at_loop_end(site: _Site, text: _Text) -> Made:
    node = site.node
    last = node.body[-1]
    if not _owns_lines(text, last) or last.lineno == node.lineno:
        return None
    pos = text.starts[last.end_lineno]
    newline = "" if text.source[:pos].endswith("\n") else "\n"

    def tree(s: _Site, root: ast.AST) -> None:
        s.node.body.append(ast.Break())
    return [(pos, pos, f"{newline}{text.indent(last.lineno)}break\n")], "added `break` at the end of the loop body", tree


def _short(code: str, limit: int = 60) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


def _swap_child(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put `new` where `old` sits in the tree (tree edits that replace a node need its parent)."""
    for parent in ast.walk(root):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise ValueError("node not found in its tree")


# ---------------------------------------------------------------- public

MAX_DELETED_LINES = 8  # a fix that must retype more than this is out of reach for an edit model


@dataclass(frozen=True)
class Site:
    """Where a mutation can go; `apply` turns it into a checked Mutation (or None)."""

    path: str
    index: int  # position in find_sites order
    kind: str
    function: str
    lineno: int


def sites(path: str, source: str) -> list[Site]:
    """Every mutation site of one file (cheap: no edit is made or checked yet)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [Site(path, i, s.kind, s.function, getattr(s.node, "lineno", 0))
            for i, s in enumerate(find_sites(tree))]


def apply(source: str, site: Site) -> Mutation | None:
    """The exact mutation at `site`, or None when its text edit cannot be made exact, deletes
    too much, or changes nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    found = find_sites(tree)
    if site.index >= len(found) or found[site.index].kind != site.kind:
        return None
    text = _Text(source)
    made = _mutate(found[site.index], text)
    if made is None:
        return None
    edits, description, tree_edit = made
    deleted = sum(source.count("\n", a, b) for a, b, _ in edits)
    if deleted > MAX_DELETED_LINES:
        return None
    mutated = _apply(source, edits)
    if mutated == source:
        return None
    fresh = ast.parse(source)
    tree_edit(find_sites(fresh)[site.index], fresh)
    try:
        got = ast.dump(ast.parse(mutated))
    except (SyntaxError, ValueError):
        return None
    if got != ast.dump(fresh) or got == ast.dump(tree):
        return None
    return Mutation(site.path, site.kind, _changed_line(source, mutated), site.function, description,
                    source, mutated)


def mutations(path: str, source: str) -> Iterator[Mutation]:
    """Every exact mutation of one file, in site order; duplicates (same resulting file) once.
    Quadratic in the file size: for a whole module, draw sites with `order` and `apply` lazily."""
    seen: set[str] = set()
    for site in sites(path, source):
        m = apply(source, site)
        if m is not None and m.mutated not in seen:
            seen.add(m.mutated)
            yield m


def _changed_line(before: str, after: str) -> int:
    """1-based line of the first difference, in the mutated text."""
    a, b = before.splitlines(), after.splitlines()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i + 1
    return min(len(a), len(b)) + 1


def order(candidates: list[Site], seed: int, prefer: Callable[[Site], bool] | None = None) -> list[Site]:
    """A seeded order that spreads kinds and files: round-robin over kinds, each kind shuffled;
    sites for which `prefer` holds come first."""
    rng = random.Random(f"mutate:{seed}")
    out: list[Site] = []
    ranked = sorted(candidates, key=lambda s: (s.path, s.index))
    tiers = [[s for s in ranked if prefer(s)], [s for s in ranked if not prefer(s)]] if prefer else [ranked]
    for tier in tiers:
        by_kind: dict[str, list[Site]] = {}
        for s in tier:
            by_kind.setdefault(s.kind, []).append(s)
        for group in by_kind.values():
            rng.shuffle(group)
        kinds = sorted(by_kind)
        rng.shuffle(kinds)
        while any(by_kind[k] for k in kinds):
            for k in kinds:
                if by_kind[k]:
                    out.append(by_kind[k].pop())
    return out


__all__ = ["KINDS", "Mutation", "Site", "sites", "apply", "mutations", "order", "find_sites"]
