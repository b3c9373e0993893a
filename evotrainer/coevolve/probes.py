"""Probe code the outer loop writes into a harness's diagnostics.py when it revises diagnostics."""

from jinja2 import Environment, StrictUndefined

_FAILURE_REWARD = Environment(undefined=StrictUndefined).from_string('''\
def {{ name }}(rollouts, rewards):
    """Mean training reward of verified failures. Added by the outer loop after a promotion
    that passed its backtest regressed held-out success: shaping that pays failures is the
    usual cause, and this probe would have flagged it."""
    paid = [w for r, w in zip(rollouts, rewards) if not r.outcome.success]
    return sum(paid) / len(paid) if paid else 0.0


PROBES.append({"name": "{{ name }}", "dimension": "result", "fn": {{ name }},
               "warn": {{ warn }}, "critical": {{ critical }}, "direction": "above"})
''')


def failure_reward_probe(name: str, warn: float = 0.05, critical: float = 0.15) -> str:
    return _FAILURE_REWARD.render(name=name, warn=warn, critical=critical)
