"""The promotion gate: trusted config decides, from backtest metrics, whether a candidate may train.

A candidate is promoted only if (1) both harnesses ran every selected rollout without a fault
and within the time budget, (2) a metric it targets (its `Targets:` trailer, which names the
metrics that judge the alert it answers, diagnose/targets.py; or else DEFAULT_TARGETS): the best
of them improves by at least `margin`, and (3) no safety metric gets worse by more
than `tolerance`. Directions come from metrics.LOWER_IS_BETTER. Ratio metrics are judged on
absolute change; `mean_tokens`, a count, on its change relative to the base (`token_margin`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from evotrainer.backtest.metrics import DEFAULT_TARGETS, EPS, LOWER_IS_BETTER, METRICS, SAFETY_METRICS, improvement
from evotrainer.config import GateConfig
from evotrainer.harness.sandbox import CandidateFailure

# Float noise must not flip a decision: 0.52 - 0.50 is 0.0200000000000000018, 0.30 - 0.28 is
# 0.0199999999999999956.
_SLACK = 1e-12
# Metrics that are counts, not ratios: judged on change relative to the base.
RELATIVE_METRICS = frozenset({"mean_tokens"})
# Safety faults that hold back every change but their repair (the false_drop_rate alert's warning).
REPAIR_FIRST = {"false_drop_rate": 0.05, "ordering_violations": 0.05, "proxy_auc": 0.95}
# A target a change can meet by destroying what it measures, and the metric that must then grow:
# dropped_live_rate is 0 when no group is live (zero the weight that made them spread), while a
# repair keeps groups it dropped, so more rollouts carry an advantage.
KEEPS = {"dropped_live_rate": "effective_data_ratio"}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateDecision:
    decision: str  # "promote" | "reject"
    target: str | None  # the metric the decision was judged on
    reasons: list[str]
    checks: list[Check]

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "target": self.target, "reasons": self.reasons,
                "checks": [asdict(c) for c in self.checks]}


def targets_from_trailer(text: str | None) -> tuple[str, ...]:
    """Every backtest metric named in a `Targets:` trailer, in order, once each (free text and
    probe names around them are fine)."""
    if not text:
        return ()
    return tuple(dict.fromkeys(w for w in re.findall(r"[A-Za-z_]+", text) if w in LOWER_IS_BETTER))


def target_from_trailer(text: str | None) -> str | None:
    """The first backtest metric named in a `Targets:` trailer."""
    return next(iter(targets_from_trailer(text)), None)


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _change(name: str, base: Mapping[str, Any], cand: Mapping[str, Any]) -> str:
    return f"{_fmt(base[name])} -> {_fmt(cand[name])}"


def decide(base: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None, gate: GateConfig, *,
           declared_target: str | Sequence[str] | None = None, failure: CandidateFailure | None = None,
           candidate_seconds: float = 0.0) -> GateDecision:
    """Apply the gate. `declared_target`: the metric(s) the candidate's Targets: trailer names;
    with several, the best of them is judged."""
    declared = (declared_target,) if isinstance(declared_target, str) else tuple(declared_target or ())
    if failure is not None or base is None or candidate is None:
        who = failure.harness if failure is not None else "candidate"
        what = failure.reason if failure is not None else "no metrics"
        detail = (f"the base harness failed, so there is nothing to compare against: {what}"
                  if who == "base" else f"the candidate failed: {what}")
        check = Check("ran", False, detail)
        return GateDecision("reject", next(iter(declared), None), [detail], [check])
    checks = [Check("ran", True, f"both harnesses scored all {candidate['n_rollouts']} rollouts without a fault")]
    in_time = candidate_seconds <= gate.time_budget_s
    checks.append(Check("time_budget", in_time, f"the candidate took {candidate_seconds:.1f} s of its "
                        f"{gate.time_budget_s:g} s budget"))
    checks.append(_signal_check(candidate))
    checks.append(_target_check(base, candidate, gate, declared))
    target = checks[-1].name.removeprefix("target:") if checks[-1].name.startswith("target:") else None
    for name in SAFETY_METRICS:
        checks.append(_safety_check(name, base, candidate, gate))
    if target is not None and target not in SAFETY_METRICS:
        checks.append(_repair_first_check(candidate))
    if target in KEEPS:
        checks.append(_keeps_check(KEEPS[target], target, base, candidate, gate))
    passed = all(c.passed for c in checks)
    reasons = [c.detail for c in checks if c.passed == passed]  # why it passed, or what failed
    return GateDecision("promote" if passed else "reject", target, reasons, checks)


def _target_check(base: Mapping[str, Any], cand: Mapping[str, Any], gate: GateConfig,
                  declared: tuple[str, ...]) -> Check:
    unknown = [n for n in declared if n not in METRICS]
    if unknown:
        return Check("target", False, f"the Targets trailer names {unknown[0]!r}, not a backtest metric "
                     f"({', '.join(METRICS)})")
    options = list(declared) or list(DEFAULT_TARGETS)
    # a report from before a metric existed lacks it: undefined, like a None value
    gains = {n: _gain(n, base[n], cand[n]) for n in options if base.get(n) is not None and cand.get(n) is not None}
    if not gains:
        return Check("target", False, f"target {options[0]} is undefined on these rollouts")
    best = max(gains, key=lambda n: gains[n] - _needed(n, gate))
    arrow = "lower" if LOWER_IS_BETTER[best] else "higher"
    needed = _needed(best, gate)
    ok = gains[best] + _SLACK >= needed
    unit = " of the base" if best in RELATIVE_METRICS else ""
    how = f"improved by {gains[best]:.4g}{unit}" if gains[best] > 0 else f"did not improve ({gains[best]:+.4g})"
    if declared:
        detail = f"target {best} ({arrow} is better) {how}: {_change(best, base, cand)}, margin {needed:g}{unit}"
        if len(declared) > 1:
            detail += f" (the best of the declared {', '.join(declared)})"
    elif ok:
        detail = (f"no target declared; {best} ({arrow} is better) {how}: {_change(best, base, cand)}, "
                  f"margin {needed:g}")
    else:
        detail = (f"no target declared and none of {', '.join(DEFAULT_TARGETS)} improved by the margin "
                  f"{gate.margin:g} (best: {best} {gains[best]:+.4g})")
    return Check(f"target:{best}", ok, detail)


def _signal_check(cand: Mapping[str, Any]) -> Check:
    """A change that leaves no rollout with a learning signal is never a gain, whatever its target
    says: a filter that keeps nothing "improves" mean_tokens to 0 and every ratio it divides."""
    ratio = cand.get("effective_data_ratio")
    ok = ratio is not None and ratio > EPS
    return Check("signal", ok, f"the candidate leaves {_fmt(ratio)} of the rollouts with a learning signal"
                 + ("" if ok else " (kept, in a live group, with a non-zero advantage): nothing to train on"))


def _repair_first_check(cand: Mapping[str, Any]) -> Check:
    """A change that targets anything but a safety metric may not pass while it leaves a safety
    fault past the limit the diagnose stage alerts at (REPAIR_FIRST): a harness that drops every
    verified success or ranks failures above successes is repaired first. Otherwise a change
    that makes such a harness cheaper (drop more long rollouts) passes on its own target, since
    a safety metric already at its worst cannot get worse."""
    past = []
    for name, limit in REPAIR_FIRST.items():
        value = cand.get(name)
        if value is not None and (value > limit if LOWER_IS_BETTER[name] else value < limit):
            past.append(f"{name} {value:.4g} ({'above' if LOWER_IS_BETTER[name] else 'below'} {limit:g})")
    ok = not past
    return Check("repair_first", ok, "no safety fault left past its limit" if ok else
                 f"the candidate leaves a safety fault unrepaired: {', '.join(past)}; only a change that "
                 "targets it may pass first")


def _keeps_check(name: str, target: str, base: Mapping[str, Any], cand: Mapping[str, Any], gate: GateConfig) -> Check:
    """The target improved; the signal it counts a share of must have grown with it, or the target
    was met by making less of it (no live group, none dropped)."""
    if base.get(name) is None or cand.get(name) is None:
        return Check(f"keeps:{name}", False, f"{target} cannot be judged without {name}")
    ok = improvement(name, base[name], cand[name]) > _SLACK
    return Check(f"keeps:{name}", ok, f"{name} grew with {target}: {_change(name, base, cand)}" if ok else
                 f"{target} improved by losing what it measures: {name} did not grow "
                 f"({_change(name, base, cand)})")


def margins_gained(name: str, base: float, cand: float, gate: GateConfig) -> float:
    """A target's improvement in units of its own margin: comparable across metrics, so that
    tokens are never ranked against ratios (coevolve's choice between passing candidates)."""
    needed = _needed(name, gate)
    return _gain(name, base, cand) / needed if needed > 0 else _gain(name, base, cand)


def _gain(name: str, base: float, cand: float) -> float:
    gain = improvement(name, base, cand)
    if name in RELATIVE_METRICS:
        return gain / base if base > 0 else 0.0
    return gain


def _needed(name: str, gate: GateConfig) -> float:
    return gate.token_margin if name in RELATIVE_METRICS else gate.margin


def _safety_check(name: str, base: Mapping[str, Any], cand: Mapping[str, Any], gate: GateConfig) -> Check:
    if base.get(name) is None or cand.get(name) is None:  # also: a report from before the metric existed
        return Check(f"safety:{name}", True, f"safety {name} is undefined on these rollouts")
    loss = -improvement(name, base[name], cand[name])
    ok = loss <= gate.tolerance + _SLACK
    verb = f"worsened by {loss:.4g}" if loss > 0 else "did not worsen"
    return Check(f"safety:{name}", ok, f"safety {name} {verb}: {_change(name, base, cand)}, "
                 f"tolerance {gate.tolerance:g}")


__all__ = ["Check", "GateDecision", "decide", "margins_gained", "target_from_trailer", "targets_from_trailer"]
