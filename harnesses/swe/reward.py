"""Reward components for swe: verified resolution in the field's tiers (0 / 0.1 / 1.0), plus a
format component and two behaviour components that the seed weights at 0 (off).

Tiers: 1.0 resolved; 0.1 a patch that applied and made some target tests pass without resolving
(FAIL_TO_PASS partly or wholly passing, per the grader's flags); 0 otherwise. Tampering never
earns a tier. Tiers of 0.3 and 0.5 were too generous in the field's runs.
"""

import re

from evotrainer.api import Rollout

PARTIAL = 0.1
EDIT = re.compile(r"<<<<<<< SEARCH|\"tool\"\s*:\s*\"edit\"|^diff --git", re.M)
SEARCH = re.compile(r"\"tool\"\s*:\s*\"(?:view|search)\"|^\s*(?:grep|rg|find|cat|ls)\b", re.M)
TEST = re.compile(r"\"tool\"\s*:\s*\"run_tests\"|\bpytest\b")


def _tier(rollout: Rollout) -> float:
    o = rollout.outcome
    if o.success:
        return 1.0
    if o.kind == "wrong" and ("f2p_partial" in o.flags or "f2p_all" in o.flags):
        return PARTIAL
    return 0.0


def _actions(rollout: Rollout) -> list:
    return [t.content for t in rollout.turns if t.role == "assistant"]


def search_before_edit(rollout: Rollout) -> float:
    """1 when a trajectory views or searches the code before its first edit (multi-turn only)."""
    actions = _actions(rollout)
    first = next((i for i, a in enumerate(actions) if EDIT.search(a)), None)
    return 1.0 if first is not None and any(SEARCH.search(a) for a in actions[:first]) else 0.0


def edit_then_test(rollout: Rollout) -> float:
    """1 when a trajectory runs the tests after its first edit (multi-turn only)."""
    actions = _actions(rollout)
    first = next((i for i, a in enumerate(actions) if EDIT.search(a)), None)
    return 1.0 if first is not None and any(TEST.search(a) for a in actions[first + 1:]) else 0.0


def reward(rollout: Rollout) -> dict:
    return {
        "correct": _tier(rollout),
        "format": 1.0 if "format_ok" in rollout.outcome.flags else 0.0,
        "search_before_edit": search_before_edit(rollout),
        "edit_then_test": edit_then_test(rollout),
    }
