"""Probe code the outer loop writes into a harness's diagnostics.py when it revises diagnostics.

The block is trusted code inside a file harness edits may change, so the loop recognises it by
structure, never by a mention of its name (`has_probe`): its statements, as parsed, must be in
the module, and nothing after them may touch PROBES or rebind the probe. Where that does not
hold, the loop adds the block again, which is always safe: the block first drops any entry of
that name, rebinds PROBES to a plain list, and its function reads no global, so no name defined
earlier in the file (a `sum`, a list subclass) can change what it computes.
"""

import ast

from jinja2 import Environment, StrictUndefined

_FAILURE_REWARD = Environment(undefined=StrictUndefined).from_string('''\
PROBES = [p for p in PROBES if p.get("name") != "{{ name }}"]


def {{ name }}(rollouts, rewards):
    """Mean training reward of verified failures. Added by the outer loop after a promotion
    that passed its backtest regressed held-out success: shaping that pays failures is the
    usual cause, and this probe would have flagged it."""
    paid, count, i = 0.0, 0, 0
    for r in rollouts:
        if not r.outcome.success:
            paid, count = paid + rewards[i], count + 1
        i += 1
    return paid / count if count else 0.0


PROBES.append({"name": "{{ name }}", "dimension": "result", "fn": {{ name }},
               "warn": {{ warn }}, "critical": {{ critical }}, "direction": "above"})
''')


def failure_reward_probe(name: str, warn: float = 0.05, critical: float = 0.15) -> str:
    return _FAILURE_REWARD.render(name=name, warn=warn, critical=critical)


def _touches(stmt: ast.stmt, name: str) -> bool:
    """Whether a statement after the block could undo it: any use of PROBES or of the probe's
    name, a definition of that name, or code that reaches names by string (exec, globals())."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and node.id in (name, "PROBES", "exec", "eval", "globals", "vars",
                                                      "setattr", "getattr", "__import__", "compile"):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True  # `import sys; sys.modules[__name__]` reaches the module's globals
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return True
        if isinstance(node, ast.Global):
            return True
    return False


def has_probe(source: str, name: str) -> bool:
    """Whether `source` (a diagnostics.py) holds the trusted probe block for `name` as written,
    with nothing after it at the top level that could change or remove it."""
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError):
        return False
    block = [ast.dump(s) for s in ast.parse(failure_reward_probe(name)).body]
    dumps = [ast.dump(s) for s in body]
    starts = [i for i in range(len(dumps) - len(block) + 1) if dumps[i:i + len(block)] == block]
    if not starts:
        return False
    after = body[starts[-1] + len(block):]
    return not any(_touches(stmt, name) for stmt in after)
