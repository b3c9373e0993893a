"""The optimiser's per-step statistics (TRL's logs) kept with each round's metrics."""

import math
from pathlib import Path

from evotrainer.train.loop import _round_summary
from evotrainer.train.step_stats import STEP_KEYS, step_stats

# What GRPOTrainer's on_log hands the callbacks, two steps of a beta-0 run (no "kl").
LOGS = [
    {"loss": 0.01, "grad_norm": 0.8, "learning_rate": 2e-4, "entropy": 1.9, "clip_ratio/region_mean": 0.0,
     "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "frac_reward_zero_std": 0.25, "reward": 0.3,
     "reward_std": 0.4, "completions/mean_length": 20.0, "verified/success": 0.2, "step_time": 9.0},
    {"loss": 0.02, "grad_norm": math.nan, "learning_rate": 2e-4, "entropy": 0.6, "clip_ratio/region_mean": 0.1,
     "clip_ratio/low_mean": 0.05, "clip_ratio/high_mean": 0.05, "frac_reward_zero_std": 0.75, "reward": 0.5,
     "reward_std": 0.1, "verified/success": 0.3, "step_time": 8.0},
]


def test_each_step_keeps_the_optimisation_statistics_trl_logged():
    steps = step_stats(LOGS)
    assert len(steps) == 2
    assert steps[0] == {"entropy": 1.9, "clip_ratio/region_mean": 0.0, "clip_ratio/low_mean": 0.0,
                        "clip_ratio/high_mean": 0.0, "grad_norm": 0.8, "frac_reward_zero_std": 0.25,
                        "reward": 0.3, "reward_std": 0.4, "learning_rate": 2e-4}
    assert "kl" not in steps[0]  # beta 0: TRL measured none, and none is made up
    assert "grad_norm" not in steps[1] and steps[1]["entropy"] == 0.6  # a NaN is dropped, not stored
    assert set(steps[1]) <= set(STEP_KEYS)


def test_a_step_with_kl_keeps_it_and_a_log_without_statistics_is_skipped():
    steps = step_stats([{"kl": 0.02, "entropy": 1.0}, {"train_runtime": 12.0}, {"reward": True}])
    assert steps == [{"kl": 0.02, "entropy": 1.0}]


def test_the_round_summary_stores_the_steps_with_its_metrics():
    summary = _round_summary(0, [], [], LOGS, 8.5, Path("adapter"))
    assert [s["entropy"] for s in summary.metrics["steps"]] == [1.9, 0.6]
    assert summary.metrics["train_reward"] == 0.4  # what the summary read before is unchanged
