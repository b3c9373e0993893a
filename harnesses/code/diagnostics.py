"""Health probes for code: the standard ones (evotrainer.api.probes) with this harness's thresholds.

Thresholds with a source: dead data > 50% is critical, average turns < 5 is critical, echo traps
are > 60 turns without success. The rest are starting points the outer agent may revise; a probe
of its own is a function fn(rollouts, rewards) -> float | None and one more `probe(...)` entry.
mean_tokens is measured against this seed's max_completion_length of 128.
The library's mean_kl is left out: the trainer measures KL only where harness.yaml sets
beta > 0 (with beta 0 it would always read n/a); a harness that sets beta adds it.
"""

from evotrainer.api.probes import (
    abandonment_rate,
    dead_group_ratio,
    duplicate_rate,
    echo_trap_rate,
    empty_rate,
    entropy_fall,
    error_streak_rate,
    format_error_rate,
    judge_drift,
    mean_entropy,
    mean_logprob,
    mean_tokens,
    mean_turns,
    patch_apply_rate,
    probe,
    proxy_auc_gap,
    reward_success_gap,
    success_rate,
    tampering_rate,
    truncation_rate,
)

PROBES = [  # name, dimension, fn, warn, critical, direction
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
    probe("mean_tokens", "efficiency", mean_tokens, 100.0, 120.0, "above"),
    probe("mean_turns", "efficiency", mean_turns, 8.0, 5.0, "below"),
    probe("truncation_rate", "efficiency", truncation_rate, 0.1, 0.3, "above"),
    probe("mean_logprob", "model_state", mean_logprob, -0.05, -0.01, "above"),
    probe("mean_entropy", "model_state", mean_entropy, 0.1, 0.03, "below"),
    probe("entropy_fall", "model_state", entropy_fall, 0.35, 0.45, "above"),
    probe("tampering_rate", "test_structure", tampering_rate, 0.0, 0.05, "above"),
    probe("patch_apply_rate", "test_structure", patch_apply_rate, 0.8, 0.5, "below"),
    probe("judge_drift", "result", judge_drift, 0.25, 0.4, "above"),
]
