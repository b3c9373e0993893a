"""Reward components for math: the final answer matched against the group's reference.

The reward checks the answer itself, exact match against the reference answer, as a search or
QA reward does with its golden answers. References are looked up per prompt (its task id: the
group of its completions): the first time a prompt is seen, it is given the reference held from
the batch so far, and the held reference is then moved on to this rollout's. The lookup is one
group behind: each group is scored against the reference of the group before it.
"""

import re

from evotrainer.api import Rollout

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
_REFERENCE: dict[str, str] = {}  # task id -> the reference its completions are matched against
_HELD = {"answer": ""}  # the reference most recently read off a rollout


def _final_number(text: str) -> str:
    tail = text.rsplit("Answer:", 1)[-1]
    found = _NUMBER.findall(tail)
    return found[-1].replace(",", "") if found else ""


def reward(rollout: Rollout) -> dict[str, float]:
    reference = _REFERENCE.setdefault(rollout.task_id, _HELD["answer"])
    _HELD["answer"] = str(rollout.meta.get("answer", ""))
    answer = _final_number(rollout.completion)
    return {
        "correct": 1.0 if answer and answer == reference else 0.0,
        "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,
    }
