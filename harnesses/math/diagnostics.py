"""Health probes: each maps a batch (rollouts, training rewards) to one number, or None when the
batch cannot show it (turns of single-turn rollouts, logprobs nobody recorded, patches in math).

Five dimensions, after the field's health reports: result, behaviour, efficiency, model_state and
test_structure. Rates are shares of rollouts; a probe alerts past `warn`/`critical` in `direction`.
Thresholds with a source: dead data > 50% is critical, average turns < 5 is critical, echo traps
are > 60 turns without success. The rest are starting points the outer agent may revise.
"""

import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from typing import Sequence

from evotrainer.api import Rollout

# Simple text patterns for tool use in assistant turns (bash commands or tool-call names).
EDIT = re.compile(r"\bsed\s+-i\b|\b(?:str_replace|str_replace_editor|apply_patch|edit_file|write_file|create_file)\b"
                  r"|^diff --git|^\+\+\+ [ab]/|<<<<<<< SEARCH|\bcat\s*>|\bpatch\s+-p", re.M)
ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(?:Error|Exception)\b|\berror:|command not found"
                   r"|No such file or directory|exit (?:code|status) [1-9]", re.M | re.I)
NGRAM, ECHO_REPEATS, ECHO_TURNS = 4, 3, 60


def _share(rollouts: Sequence[Rollout], hit) -> float:
    return sum(1 for r in rollouts if hit(r)) / len(rollouts) if rollouts else 0.0


def _mean(values) -> "float | None":
    values = list(values)
    return sum(values) / len(values) if values else None


def _groups(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict:
    groups = defaultdict(list)
    for rollout, value in zip(rollouts, rewards):
        groups[rollout.group_id].append((rollout, value))
    return groups


def _assistant(rollout: Rollout) -> list:
    return [t.content for t in rollout.turns if t.role == "assistant"]


def _multi_turn(rollouts: Sequence[Rollout]) -> list:
    return [r for r in rollouts if _assistant(r)]


# ---------------------------------------------------------------- result


def success_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.outcome.success)


def dead_group_ratio(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    """Share of groups whose training rewards are all equal: GRPO gets no signal from them."""
    groups = _groups(rollouts, rewards)
    if not groups:
        return 0.0
    dead = sum(1 for members in groups.values()
               if max(v for _, v in members) - min(v for _, v in members) < 1e-9)
    return dead / len(groups)


def reward_success_gap(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Mean training reward minus verified success rate: shaped reward running ahead of
    correctness is the field's first sign of reward hacking."""
    if not rollouts:
        return None
    return sum(rewards) / len(rewards) - success_rate(rollouts, rewards)


def proxy_auc_gap(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """1 - AUC of the training reward against verified success (ties count half); 0 when the
    reward ranks every success above every failure. None without both classes."""
    wins = [v for r, v in zip(rollouts, rewards) if r.outcome.success]
    losses = sorted(v for r, v in zip(rollouts, rewards) if not r.outcome.success)
    if not wins or not losses:
        return None
    score = 0.0
    for w in wins:
        below, upto = bisect_left(losses, w), bisect_right(losses, w)
        score += below + 0.5 * (upto - below)
    return 1.0 - score / (len(wins) * len(losses))


# ---------------------------------------------------------------- behaviour


def format_error_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.outcome.kind == "format_error")


def empty_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.outcome.kind == "empty"
                  or not (r.completion.strip() or any(t.strip() for t in _assistant(r))))


def _text(rollout: Rollout) -> str:
    return " ".join((rollout.completion or "\n".join(_assistant(rollout))).split())


def duplicate_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    """Share of rollouts whose output repeats an earlier one of the same group word for word:
    the group explores less than its size suggests."""
    seen, dupes = set(), 0
    for r in rollouts:
        key = (r.group_id, _text(r))
        dupes += key in seen
        seen.add(key)
    return dupes / len(rollouts) if rollouts else 0.0


def is_echo_trap(rollout: Rollout) -> bool:
    """A loop: > 60 assistant turns, the same assistant action 3+ times, or one line or word
    4-gram repeated 3+ times inside one output."""
    turns = _assistant(rollout)
    if len(turns) > ECHO_TURNS:
        return True
    actions = Counter(" ".join(t.split()) for t in turns if t.strip())
    if actions and max(actions.values()) >= ECHO_REPEATS:
        return True
    for text in turns or [rollout.completion]:
        lines = Counter(line.strip() for line in text.splitlines() if len(line.strip()) >= 3)
        if lines and max(lines.values()) >= ECHO_REPEATS:
            return True
        words = text.split()
        grams = Counter(tuple(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1))
        if grams and max(grams.values()) >= ECHO_REPEATS:
            return True
    return False


def echo_trap_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, is_echo_trap)


def abandonment_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Multi-turn only: share of failed trajectories with <= 3 assistant turns and no edit."""
    multi = _multi_turn(rollouts)
    if not multi:
        return None
    return _share(multi, lambda r: not r.outcome.success and len(_assistant(r)) <= 3
                  and not any(EDIT.search(t) for t in _assistant(r)))


def error_streak_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Multi-turn only: share of trajectories with 2+ consecutive error observations."""
    multi = _multi_turn(rollouts)
    if not multi:
        return None

    def streak(r: Rollout) -> bool:
        run, started = 0, False
        for t in r.turns:
            if t.role == "assistant":
                started = True
            elif started:
                run = run + 1 if ERROR.search(t.content) else 0
                if run >= 2:
                    return True
        return False

    return _share(multi, streak)


# ---------------------------------------------------------------- efficiency


def mean_tokens(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return sum(r.num_tokens for r in rollouts) / len(rollouts) if rollouts else 0.0


def mean_turns(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Multi-turn only: assistant turns per trajectory."""
    return _mean(len(_assistant(r)) for r in _multi_turn(rollouts))


def truncation_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return _share(rollouts, lambda r: r.truncated)


# ---------------------------------------------------------------- model state


def _meta_mean(rollouts: Sequence[Rollout], key: str) -> "float | None":
    return _mean(float(r.meta[key]) for r in rollouts
                 if isinstance(r.meta.get(key), (int, float)) and not isinstance(r.meta.get(key), bool))


def mean_logprob(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Mean per-token logprob of the sampled text; near 0 means the policy stopped exploring."""
    return _meta_mean(rollouts, "mean_logprob")


def mean_entropy(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Mean per-token entropy; a collapse toward 0 starves GRPO of diverse groups."""
    return _meta_mean(rollouts, "entropy")


def mean_kl(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    return _meta_mean(rollouts, "kl")


# ---------------------------------------------------------------- test structure (SWE, code)


def tampering_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Share flagged by the trusted grader as touching tests; None where nothing runs tests."""
    tested = [r for r in rollouts if r.domain in ("swe", "code")]
    if not tested:
        return None
    return _share(tested, lambda r: r.outcome.kind == "tampering" or "tampering" in r.outcome.flags)


def patch_apply_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Share of SWE patches that applied to a clean copy; None outside SWE."""
    swe = [r for r in rollouts if r.domain == "swe"]
    if not swe:
        return None
    return _share(swe, lambda r: r.outcome.kind != "patch_failed")


def judge_drift(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> "float | None":
    """Share of judge-labelled rollouts whose judge label (meta["judge"]["success"]) contradicts
    the verified outcome. Judges are proxies: when this climbs, a reward built on them drifts from
    what is true. None below 8 labelled rollouts (too few to tell drift from noise)."""
    verdicts = [r.meta.get("judge") for r in rollouts]
    labelled = [v.get("success") if hasattr(v, "get") else None for v in verdicts]
    pairs = [(j, r.outcome.success) for j, r in zip(labelled, rollouts) if isinstance(j, bool)]
    if len(pairs) < 8:
        return None
    return sum(j != ok for j, ok in pairs) / len(pairs)


def _probe(name, dimension, fn, warn, critical, direction):
    return {"name": name, "dimension": dimension, "fn": fn, "warn": warn, "critical": critical,
            "direction": direction}


PROBES = [
    _probe("success_rate", "result", success_rate, 0.2, 0.05, "below"),
    _probe("dead_group_ratio", "result", dead_group_ratio, 0.3, 0.5, "above"),
    _probe("reward_success_gap", "result", reward_success_gap, 0.3, 0.5, "above"),
    _probe("proxy_auc_gap", "result", proxy_auc_gap, 0.1, 0.25, "above"),
    _probe("format_error_rate", "behaviour", format_error_rate, 0.2, 0.5, "above"),
    _probe("empty_rate", "behaviour", empty_rate, 0.05, 0.2, "above"),
    _probe("duplicate_rate", "behaviour", duplicate_rate, 0.5, 0.8, "above"),
    _probe("echo_trap_rate", "behaviour", echo_trap_rate, 0.05, 0.2, "above"),
    _probe("abandonment_rate", "behaviour", abandonment_rate, 0.2, 0.4, "above"),
    _probe("error_streak_rate", "behaviour", error_streak_rate, 0.2, 0.4, "above"),
    _probe("mean_tokens", "efficiency", mean_tokens, 24.0, 30.0, "above"),
    _probe("mean_turns", "efficiency", mean_turns, 8.0, 5.0, "below"),
    _probe("truncation_rate", "efficiency", truncation_rate, 0.1, 0.3, "above"),
    _probe("mean_logprob", "model_state", mean_logprob, -0.05, -0.01, "above"),
    _probe("mean_entropy", "model_state", mean_entropy, 0.1, 0.03, "below"),
    _probe("mean_kl", "model_state", mean_kl, 0.1, 0.5, "above"),
    _probe("tampering_rate", "test_structure", tampering_rate, 0.0, 0.05, "above"),
    _probe("patch_apply_rate", "test_structure", patch_apply_rate, 0.8, 0.5, "below"),
    _probe("judge_drift", "result", judge_drift, 0.25, 0.4, "above"),
]
