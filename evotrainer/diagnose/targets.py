"""Targets from evidence: a proposal is judged by the backtest metrics of the alert it answers.

Which metric a repair should move is a fact about the probe that fired, not about the skill or
agent that wrote the repair: a reward whose fault is ties between successes and failures shows in
`proxy_auc` while `ordering_violations` is already 0, so a repair judged only on the latter "did
not improve: 0 -> 0". The table is `evotrainer.api.probes.JUDGED_BY` (probe -> metrics, the most
direct first); directions come from `backtest.metrics.LOWER_IS_BETTER`.

A Targets trailer written from evidence reads `<probes>: <metrics>`, e.g.
`proxy_auc_gap: proxy_auc, ordering_violations, counterfactual_violations`. The gate takes every
metric word in it (`backtest.gate.targets_from_trailer`); the live pilot takes the first probe word
(`coevolve.pilot.target_probe`), which is the probe that fired. A probe only training can judge
(the optimisation's dynamics: entropy, duplicates) has no metric: `entropy_fall (judged live)`.

Safety evidence goes first under the cap on proposals: a proposal whose targets include a safety
metric (the gate's SAFETY_METRICS, or `dropped_live_rate`) answers an alert about ordering, AUC,
false drops, hacking mass or dropped live groups, and is tried before any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from evotrainer.api.probes import JUDGED_BY
from evotrainer.backtest.gate import targets_from_trailer
from evotrainer.backtest.metrics import LOWER_IS_BETTER, SAFETY_METRICS

# Safety under the proposal cap: the gate's safety metrics plus dropped live signal.
SAFETY_TARGETS = frozenset(SAFETY_METRICS) | {"dropped_live_rate"}
SAFETY_PROBES = frozenset(p for p, metrics in JUDGED_BY.items() if SAFETY_TARGETS & set(metrics))
SEVERITY = {"critical": 2, "warn": 1, "ok": 0, "n/a": -1}
LIVE = "(judged live)"


def judged_by(probe: str) -> tuple[tuple[str, str], ...]:
    """The metrics that judge a repair of `probe`'s alert, each with its better direction
    ("lower" or "higher"); () for a probe only training can judge or one not in the table."""
    return tuple((m, "lower" if LOWER_IS_BETTER[m] else "higher") for m in JUDGED_BY.get(probe, ()))


def targets_text(probes: Sequence[str], fallback: str = "") -> str:
    """The Targets trailer for a proposal answering `probes` (most severe first): the known ones
    and the union of their metrics. `fallback` (the proposer's own target) when none is known."""
    known = [p for p in dict.fromkeys(probes) if p in JUDGED_BY]
    if not known:
        return fallback
    metrics = list(dict.fromkeys(m for p in known for m in JUDGED_BY[p]))
    return f"{', '.join(known)}: {', '.join(metrics)}" if metrics else f"{', '.join(known)} {LIVE}"


def _alerts(report: Any) -> list[Any]:
    """The report's alerting probe results, most severe first (a HealthReport or its JSON)."""
    if report is None:
        return []
    if isinstance(report, dict):
        from evotrainer.diagnose.health import HealthReport

        report = HealthReport.from_json(report)
    return sorted((p for p in report.probes if p.alert), key=lambda p: -SEVERITY[p.level])


def retarget(text: str, report: Any = None) -> str:
    """An agent's free Targets text as the evidence's: the probes it names give their metrics (a
    word that is also a metric, like dead_group_ratio, counts as the metric); else the metrics it
    names pick the alerting probes of `report` judged by any of them, most severe first.
    Unchanged when it is evidence text already (`<probes>: <metrics>`) or when neither applies
    (no probe named, no alert its metrics judge): the gate then checks what the agent named."""
    text = text or ""
    if ":" in text:
        head = re.findall(r"[A-Za-z_]+", text.split(":", 1)[0])
        if head and all(w in JUDGED_BY for w in head):
            return text
    named = [w for w in re.findall(r"[A-Za-z_]+", text) if w in JUDGED_BY and w not in LOWER_IS_BETTER]
    if named:
        return targets_text(named, text)
    metrics = set(targets_from_trailer(text))
    fired = [p.name for p in _alerts(report) if metrics & set(JUDGED_BY.get(p.name, ()))]
    return targets_text(fired, text) if fired else text


def retarget_all(proposals: Iterable[Any], report: Any) -> list[Any]:
    """Each proposal with its targets from the evidence (retarget). A branch an agent wrote itself
    keeps the trailer it was committed with (the tool surface retargets at write time)."""
    return [p if getattr(p, "branch", None) is not None else replace(p, targets=retarget(p.targets, report))
            for p in proposals]


def is_safety(targets: str | None) -> bool:
    """Whether a Targets text answers safety evidence: it names a safety metric."""
    return bool(SAFETY_TARGETS & set(targets_from_trailer(targets)))


__all__ = ["LIVE", "SAFETY_PROBES", "SAFETY_TARGETS", "is_safety", "judged_by", "retarget", "retarget_all",
           "targets_text"]
