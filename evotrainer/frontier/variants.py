"""Variants of frontier tasks: the same problem family with perturbed numbers or parameters.

Math: a level 0-2 expression keeps its form and gets nearby operands; a level 3 word problem keeps
its template and draws fresh operands from the template's own sampler. Code: the same family
draws fresh parameters. Every variant is a canonical key, so its text, answer, hidden tests and
split follow from the domain's own generator; nothing here decides correctness (validate.py does).
"""

from __future__ import annotations

import json
import random
import re

from evotrainer.domains import code as code_domain
from evotrainer.domains import math as math_domain
from evotrainer.domains.base import Task
from evotrainer.errors import EvotrainerError


class NoVariant(EvotrainerError, ValueError):
    """The parent task cannot be varied (e.g. a task imported from a JSONL file)."""


def _number_spread(value: int, rng: random.Random) -> int:
    return max(0, value + rng.choice([-3, -2, -1, 1, 2, 3]) * max(1, value // 10))


def math_variant_key(parent: Task, rng: random.Random) -> str:
    key = parent.meta.get("key")
    if not isinstance(key, str) or not re.match(r"^L[0-3]:", key):
        raise NoVariant(f"{parent.task_id}: not a procedural math task (no canonical key)")
    level, body = int(key[1]), key[3:]
    if level == 3:
        template = body.split(":", 1)[0]
        if template not in math_domain._L3_TEMPLATES:
            raise NoVariant(f"{parent.task_id}: unknown word-problem template {template!r}")
        a, b, c = math_domain._L3_TEMPLATES[template][3](rng)
        return f"L3:{template}:{a}:{b}:{c}"
    # Same operators and parentheses, nearby operands.
    return f"L{level}:" + re.sub(r"\d+", lambda m: str(_number_spread(int(m.group()), rng)), body)


def code_variant_key(parent: Task, rng: random.Random) -> str:
    key = parent.meta.get("key")
    parts = key.split(":", 2) if isinstance(key, str) else []
    if len(parts) != 3 or parts[1] not in code_domain._BY_NAME:
        raise NoVariant(f"{parent.task_id}: not a procedural code task (no canonical key)")
    family = code_domain._BY_NAME[parts[1]]
    return f"{parts[0]}:{family.name}:{json.dumps(family.draw(rng), sort_keys=True)}"


def variant(parent: Task, rng: random.Random, heldout_fraction: float) -> Task:
    """One variant of `parent` (NoVariant when the domain or source has no generator for it)."""
    if parent.domain == "math":
        return math_domain.task_from_key(math_variant_key(parent, rng), heldout_fraction)
    if parent.domain == "code":
        return code_domain.task_from_key(code_variant_key(parent, rng), heldout_fraction)
    raise NoVariant(f"{parent.task_id}: no variant generator for domain {parent.domain!r}")
