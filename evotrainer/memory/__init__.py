"""Memory and cache: a replay memory of tasks with difficulty-stratified sampling and smooth
forgetting (strata.py, replay.py), the harness curriculum that uses it (curriculum.py), and a
rollout cache reused within one model version (cache.py)."""

from evotrainer.memory.replay import Entry, ReplayMemory, uniform_sample
from evotrainer.memory.strata import STRATA, Plan, StrataPolicy, plan, stratified_weights, stratum

__all__ = ["STRATA", "Entry", "Plan", "ReplayMemory", "StrataPolicy", "plan", "stratified_weights", "stratum",
           "uniform_sample"]
