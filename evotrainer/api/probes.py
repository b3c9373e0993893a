"""The standard health probes, for harness diagnostics.py files to import: each maps a batch
(rollouts, training rewards) to one number, or None when the batch cannot show it (turns of
single-turn rollouts, patches in math).

Harness code imports this module, so it is held to what harness code may do: pure computation
on the rollouts it is handed, no files, processes, network or store, and imports of nothing a
harness could not import itself (the standard-library modules below and evotrainer.api). The
sandbox worker checks the imports its functions make as it checks a harness's own
(sandbox_worker._trusted), so calling a probe here grants a harness nothing.

The standard probe table is STANDARD, with default thresholds; a harness's diagnostics.py is
`PROBES = standard(<the thresholds it changes>)` plus `probe(name, dimension, fn, warn, critical,
direction)` entries of its own. JUDGED_BY names, for every probe, the backtest metrics that judge
a repair of what it sees. Adding a standard probe: its function and its two table rows here, its
line in docs/design.md, and a test.

Five dimensions, after the field's health reports: result, behaviour, efficiency, model_state and
test_structure. Rates are shares of rollouts. The model-state probes read per-rollout means the
trainer writes into `meta` (train/sample_stats.py): MODEL_STATE_KEYS.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from evotrainer.api import Rollout

# Simple text patterns for tool use in assistant turns (bash commands or tool-call names).
EDIT = re.compile(r"\bsed\s+-i\b|\b(?:str_replace|str_replace_editor|apply_patch|edit_file|write_file|create_file)\b"
                  r"|^diff --git|^\+\+\+ [ab]/|<<<<<<< SEARCH|\bcat\s*>|\bpatch\s+-p", re.M)
ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(?:Error|Exception)\b|\berror:|command not found"
                   r"|No such file or directory|exit (?:code|status) [1-9]", re.M | re.I)
NGRAM, ECHO_REPEATS, ECHO_TURNS = 4, 3, 60

# meta key -> what the trainer stores there for each rollout it trained on: per-token means over
# its loss tokens, under the policy that sampled it (train/sample_stats.py).
MODEL_STATE_KEYS = {
    "mean_logprob": "log-probability of each sampled token, at the sampling temperature",
    "entropy": "entropy of the next-token distribution",
    "kl": "KL to the reference model (TRL's k3 estimate); only where harness.yaml sets beta > 0",
}


def probe(name: str, dimension: str, fn: Callable[[Sequence[Rollout], Sequence[float]], Any], warn: float,
          critical: float, direction: str) -> dict:
    """One PROBES entry: `fn` alerts past `warn`/`critical` in `direction` ("above" or "below")."""
    return {"name": name, "dimension": dimension, "fn": fn, "warn": warn, "critical": critical,
            "direction": direction}


# ---------------------------------------------------------------- helpers for a harness's own probes


def share(rollouts: Sequence[Rollout], hit: Callable[[Rollout], bool]) -> float:
    """Share of `rollouts` for which `hit` is true; 0.0 for none."""
    return sum(1 for r in rollouts if hit(r)) / len(rollouts) if rollouts else 0.0


def mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def groups(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict:
    """group id -> [(rollout, training reward)], in order."""
    out = defaultdict(list)
    for rollout, value in zip(rollouts, rewards):
        out[rollout.group_id].append((rollout, value))
    return out


def assistant_turns(rollout: Rollout) -> list:
    return [t.content for t in rollout.turns if t.role == "assistant"]


def multi_turn(rollouts: Sequence[Rollout]) -> list:
    """The rollouts with at least one assistant turn (agent trajectories)."""
    return [r for r in rollouts if assistant_turns(r)]


def meta_mean(rollouts: Sequence[Rollout], key: str) -> float | None:
    """Mean of a numeric `meta[key]` over the rollouts that have one; None when none has."""
    return mean(float(r.meta[key]) for r in rollouts
                if isinstance(r.meta.get(key), (int, float)) and not isinstance(r.meta.get(key), bool))


# ---------------------------------------------------------------- result


def success_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return share(rollouts, lambda r: r.outcome.success)


def dead_group_ratio(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    """Share of groups whose training rewards are all equal: GRPO gets no signal from them."""
    by_group = groups(rollouts, rewards)
    if not by_group:
        return 0.0
    dead = sum(1 for members in by_group.values()
               if max(v for _, v in members) - min(v for _, v in members) < 1e-9)
    return dead / len(by_group)


def reward_success_gap(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Mean training reward minus verified success rate: shaped reward running ahead of
    correctness is the field's first sign of reward hacking."""
    if not rollouts:
        return None
    return sum(rewards) / len(rewards) - success_rate(rollouts, rewards)


def proxy_auc_gap(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
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


def judge_drift(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Share of judge-labelled rollouts whose judge label (meta["judge"]["success"]) contradicts
    the verified outcome. Judges are proxies: when this climbs, a reward built on them drifts from
    what is true. None below 8 labelled rollouts (too few to tell drift from noise)."""
    verdicts = [r.meta.get("judge") for r in rollouts]
    labelled = [v.get("success") if isinstance(v, Mapping) else None for v in verdicts]
    pairs = [(j, r.outcome.success) for j, r in zip(labelled, rollouts) if isinstance(j, bool)]
    if len(pairs) < 8:
        return None
    return sum(j != ok for j, ok in pairs) / len(pairs)


# ---------------------------------------------------------------- behaviour


def format_error_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return share(rollouts, lambda r: r.outcome.kind == "format_error")


def empty_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return share(rollouts, lambda r: r.outcome.kind == "empty"
                 or not (r.completion.strip() or any(t.strip() for t in assistant_turns(r))))


def _text(rollout: Rollout) -> str:
    return " ".join((rollout.completion or "\n".join(assistant_turns(rollout))).split())


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
    turns = assistant_turns(rollout)
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
    return share(rollouts, is_echo_trap)


def abandonment_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Multi-turn only: share of failed trajectories with <= 3 assistant turns and no edit."""
    multi = multi_turn(rollouts)
    if not multi:
        return None
    return share(multi, lambda r: not r.outcome.success and len(assistant_turns(r)) <= 3
                 and not any(EDIT.search(t) for t in assistant_turns(r)))


def _error_streak(rollout: Rollout) -> bool:
    run, started = 0, False
    for t in rollout.turns:
        if t.role == "assistant":
            started = True
        elif started:
            run = run + 1 if ERROR.search(t.content) else 0
            if run >= 2:
                return True
    return False


def error_streak_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Multi-turn only: share of trajectories with 2+ consecutive error observations."""
    multi = multi_turn(rollouts)
    if not multi:
        return None
    return share(multi, _error_streak)


# ---------------------------------------------------------------- efficiency


def mean_tokens(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return sum(r.num_tokens for r in rollouts) / len(rollouts) if rollouts else 0.0


def mean_turns(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Multi-turn only: assistant turns per trajectory."""
    return mean(len(assistant_turns(r)) for r in multi_turn(rollouts))


def truncation_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float:
    return share(rollouts, lambda r: r.truncated)


# ---------------------------------------------------------------- model state (meta the trainer writes)


def mean_logprob(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Mean per-token logprob of the sampled text; near 0 means the policy stopped exploring.
    None for rollouts no training step measured (imported ones, ones a filter dropped)."""
    return meta_mean(rollouts, "mean_logprob")


def mean_entropy(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Mean per-token entropy; a collapse toward 0 starves GRPO of diverse groups."""
    return meta_mean(rollouts, "entropy")


def entropy_fall(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Share of the entropy the batch's first training step sampled with that its first half of
    steps has already lost: 1 - (mean entropy over the first half of the steps) / (mean entropy
    of the first step). A learning rate that collapses the policy loses most of it within a step
    or two; ordinary GRPO loses it over rounds, so the level alone (mean_entropy) cannot tell the
    two apart early. None with fewer than 4 steps that have entropies (`meta["train_step"]`, which
    the diagnose stage sets from the store)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in rollouts:
        step = r.meta.get("train_step")
        value = r.meta.get("entropy")
        if isinstance(step, int) and isinstance(value, (int, float)) and not isinstance(value, bool):
            by_step[step].append(float(value))
    steps = sorted(by_step)
    if len(steps) < 4:
        return None
    means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
    if means[0] <= 0:
        return None
    early = means[: len(means) // 2]
    return 1.0 - (sum(early) / len(early)) / means[0]


def mean_kl(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Mean per-token KL of the policy to its reference; measured only with beta > 0."""
    return meta_mean(rollouts, "kl")


# ---------------------------------------------------------------- test structure (SWE, code)


def tampering_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Share flagged by the trusted grader as touching tests; None where nothing runs tests."""
    tested = [r for r in rollouts if r.domain in ("swe", "code")]
    if not tested:
        return None
    return share(tested, lambda r: r.outcome.kind == "tampering" or "tampering" in r.outcome.flags)


def patch_apply_rate(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
    """Share of SWE patches that applied to a clean copy; None outside SWE."""
    swe = [r for r in rollouts if r.domain == "swe"]
    if not swe:
        return None
    return share(swe, lambda r: r.outcome.kind != "patch_failed")


# ---------------------------------------------------------------- the standard table

# Every seed's probes, in report order, with default thresholds. A seed's diagnostics.py is
# `PROBES = standard(<only what differs>)`, so a probe added here reaches every new workspace whole.
STANDARD: tuple[dict, ...] = (  # name, dimension, fn, warn, critical, direction
    probe("success_rate", "result", success_rate, 0.2, 0.05, "below"),
    probe("dead_group_ratio", "result", dead_group_ratio, 0.3, 0.5, "above"),
    probe("reward_success_gap", "result", reward_success_gap, 0.3, 0.5, "above"),
    probe("proxy_auc_gap", "result", proxy_auc_gap, 0.02, 0.1, "above"),  # the seed reward ranks every success first: 0
    probe("format_error_rate", "behaviour", format_error_rate, 0.2, 0.5, "above"),
    probe("empty_rate", "behaviour", empty_rate, 0.05, 0.2, "above"),
    probe("duplicate_rate", "behaviour", duplicate_rate, 0.5, 0.8, "above"),
    probe("echo_trap_rate", "behaviour", echo_trap_rate, 0.05, 0.2, "above"),
    probe("abandonment_rate", "behaviour", abandonment_rate, 0.2, 0.4, "above"),
    probe("error_streak_rate", "behaviour", error_streak_rate, 0.2, 0.4, "above"),
    # a seed sets its own, about 0.75 and 0.94 of its max_completion_length (these fit 32)
    probe("mean_tokens", "efficiency", mean_tokens, 24.0, 30.0, "above"),
    probe("mean_turns", "efficiency", mean_turns, 8.0, 5.0, "below"),
    probe("truncation_rate", "efficiency", truncation_rate, 0.1, 0.3, "above"),
    probe("mean_logprob", "model_state", mean_logprob, -0.05, -0.01, "above"),
    probe("mean_entropy", "model_state", mean_entropy, 0.1, 0.03, "below"),
    probe("entropy_fall", "model_state", entropy_fall, 0.35, 0.45, "above"),
    probe("tampering_rate", "test_structure", tampering_rate, 0.0, 0.05, "above"),
    probe("patch_apply_rate", "test_structure", patch_apply_rate, 0.8, 0.5, "below"),
    probe("judge_drift", "result", judge_drift, 0.25, 0.4, "above"),
)

# Probe -> the backtest metrics (docs/design.md, "Backtest metrics") that judge a repair of what it
# sees, the most direct first. A proposal made for a probe's alert names these in its Targets
# trailer, whatever agent made it (evotrainer/diagnose/targets.py). Empty: only training shows a
# repair (the optimisation's dynamics), so the live pilot judges it by the probe itself. The
# trusted probes the diagnose stage computes and the loop's own are here too; a harness's own
# probe that is not falls back to the target its proposer names.
JUDGED_BY: dict[str, tuple[str, ...]] = {
    "success_rate": ("sampled_dead_group_ratio", "dead_group_ratio", "effective_data_ratio"),
    "dead_group_ratio": ("dead_group_ratio", "effective_data_ratio", "sampled_dead_group_ratio"),
    "reward_success_gap": ("proxy_auc", "ordering_violations", "counterfactual_violations", "hacking_reward_mass"),
    "proxy_auc_gap": ("proxy_auc", "ordering_violations", "counterfactual_violations"),
    "format_error_rate": ("dead_group_ratio", "effective_data_ratio"),
    "empty_rate": ("hacking_reward_mass", "dead_group_ratio"),
    "duplicate_rate": (),
    "echo_trap_rate": ("mean_tokens",),
    "abandonment_rate": ("effective_data_ratio",),
    "error_streak_rate": ("mean_tokens",),
    "mean_tokens": ("mean_tokens",),
    "mean_turns": ("dead_group_ratio", "mean_tokens"),
    "truncation_rate": ("mean_tokens", "effective_data_ratio"),
    "mean_logprob": (),
    "mean_entropy": (),
    "entropy_fall": (),
    "mean_kl": (),
    "tampering_rate": ("hacking_reward_mass",),
    "patch_apply_rate": ("effective_data_ratio",),
    "judge_drift": ("proxy_auc", "ordering_violations"),
    # the swe seed's own
    "timeout_rate": ("mean_tokens",),
    "empty_patch_rate": ("hacking_reward_mass",),
    "partial_rate": ("proxy_auc", "ordering_violations", "counterfactual_violations"),
    # trusted: the diagnose stage (diagnose/health.py), the held-out guard, the loop's own probe
    "false_drop_rate": ("false_drop_rate", "dropped_live_rate"),
    "dropped_live_rate": ("dropped_live_rate", "false_drop_rate", "effective_data_ratio"),
    "mid_band_weight": ("sampled_dead_group_ratio",),
    "reward_hacking": ("hacking_reward_mass", "proxy_auc", "ordering_violations", "counterfactual_violations"),
    "failure_reward_mean": ("ordering_violations", "counterfactual_violations", "proxy_auc"),
}


def standard(drop: Sequence[str] = (), **thresholds: tuple[float, float]) -> list[dict]:
    """The standard probes as a new PROBES list: `name=(warn, critical)` sets a probe's thresholds,
    `drop` leaves probes out. A seed's diagnostics.py calls it with only what differs, then
    appends probes of its own."""
    names = {p["name"] for p in STANDARD}
    unknown = sorted((set(thresholds) | set(drop)) - names)
    if unknown:
        raise ValueError(f"not standard probes: {', '.join(unknown)} (standard: {', '.join(sorted(names))})")
    out = []
    for entry in STANDARD:
        if entry["name"] in drop:
            continue
        warn, critical = thresholds.get(entry["name"], (entry["warn"], entry["critical"]))
        out.append({**entry, "warn": warn, "critical": critical})
    return out
