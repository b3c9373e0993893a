"""Inside one sandbox worker: replay one harness version over frozen rollouts, return raw values.

The worker holds one harness, never two (base and candidate never share a process) and nothing
else: no store, no URL, no path. It runs the very job training's scoring worker runs
(harness/calls.py, `HarnessJob`): one worker kind and one call protocol for both, so a harness
cannot tell a replay from training by what its process loaded or which calls it receives. Each
message carries frozen rollouts as plain data (rows.py); the reply holds only what the harness
decided, per rollout in the order sent:

    {"ids": [...], "rewards": [{component: float}], "keep": [bool], "cut": [bool],
     "keep_group": [bool per group], "counterfactual": [{component: float} or None]}

`counterfactual` holds, for each verified failure, the reward of the same rollout rescored as a
verified success (outcome success, score 1, kind "ok", its flags kept), None for a success: what
the reward would pay a success in that group (metrics.py, counterfactual_violations).

or, for the curriculum, {"weights": {task_id: float}}. The parent checks every value and joins
them with the verified outcomes it kept (scoring.py); nothing here decides a metric. The
worker's reruns only give an honest nondeterministic harness a clear reason early; the check that
counts is the parent's rerun in a second, fresh worker (engine.py).
"""

from __future__ import annotations

from evotrainer.harness.calls import HarnessJob

ReplayJob = HarnessJob  # the backtest's name for the one harness job

__all__ = ["ReplayJob"]
