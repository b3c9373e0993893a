"""The health report: every probe of a harness over a batch of stored rollouts, with levels and
example rollouts for each alert.

Training rewards are recomputed with the harness being diagnosed (`reward` + `training_reward`),
not read from the store, so a report says what *this* harness version would see; rollouts that
came in through `rollouts import` need no training run. Examples are found generically, so a probe
the outer agent adds gets them too: the groups on which the probe alone would alert, and inside
them the rollouts on which it alone would alert (a truncated rollout for truncation_rate); for
group-level probes (dead groups, duplicates) the group's first rollout stands in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evotrainer.api import SOURCE_REPORTED, Rollout, TaskStats
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness, HarnessError, Probe
from evotrainer.harness.redact import redact
from evotrainer.store import StoredRollout

LEVELS = ("ok", "warn", "critical", "n/a")
SEVERITY = {"critical": 2, "warn": 1, "ok": 0, "n/a": -1}
MAX_EXAMPLES = 3
FALSE_DROP = "false_drop_rate"  # trusted: computed here from the harness's filter decisions
FALSE_DROP_THRESHOLDS = (0.05, 0.2)  # warn, critical
MID_BAND = "mid_band_weight"  # trusted: the curriculum's weights over the history the round was drawn from
MID_BAND_THRESHOLDS = (0.5, 0.25)  # warn, critical; it alerts below
MID_BAND_ATTEMPTS = 4  # a task is in the mid band after this many attempts with mixed outcomes
PREVIEW_CHARS = 240


@dataclass(frozen=True)
class ProbeResult:
    """One probe's value on the batch and what it means."""

    name: str
    dimension: str
    value: float | None
    level: str  # ok | warn | critical | n/a
    warn: float
    critical: float
    direction: str  # "above": alerts when the value rises past the thresholds; "below": falls
    examples: tuple[str, ...] = ()  # rollout ids that exemplify an alert
    error: str | None = None  # the probe raised or returned junk: value None, level n/a

    @property
    def alert(self) -> bool:
        return self.level in ("warn", "critical")

    def threshold(self) -> float | None:
        """The threshold this value crossed (critical before warn), None when it crossed none."""
        return self.critical if self.level == "critical" else self.warn if self.level == "warn" else None

    def describe(self) -> str:
        """E.g. `dead_group_ratio = 0.625 (critical: above 0.5)`."""
        if self.value is None:
            return f"{self.name} = n/a" + (f" ({self.error})" if self.error else "")
        crossed = self.threshold()
        where = (f"{self.level}: {self.direction} {crossed:g}" if crossed is not None
                 else f"ok; warn {self.direction} {self.warn:g}")
        return f"{self.name} = {self.value:.4g} ({where})"


@dataclass(frozen=True)
class Example:
    """A short view of one example rollout, enough to judge it without the store."""

    id: str
    task_id: str
    group_id: str
    kind: str
    success: bool
    reward: float
    truncated: bool
    num_tokens: int
    turns: int
    preview: str


@dataclass
class HealthReport:
    probes: list[ProbeResult]
    n_rollouts: int
    n_groups: int
    harness_version: str | None = None
    scope: str = "all"
    examples: dict[str, Example] = field(default_factory=dict)  # by rollout id
    # Rollouts whose outcome another engine reported (api.SOURCE_REPORTED), not our check
    source_reported: int = 0

    @property
    def alerts(self) -> list[ProbeResult]:
        """Probes at warn or critical, critical first, each in probe order."""
        return sorted((p for p in self.probes if p.alert), key=lambda p: -SEVERITY[p.level])

    def get(self, name: str) -> ProbeResult | None:
        return next((p for p in self.probes if p.name == name), None)

    def value(self, name: str) -> float | None:
        probe = self.get(name)
        return probe.value if probe is not None else None

    def dimensions(self) -> list[str]:
        return list(dict.fromkeys(p.dimension for p in self.probes))

    def to_json(self) -> dict[str, Any]:
        return {
            "harness_version": self.harness_version,
            "scope": self.scope,
            "n_rollouts": self.n_rollouts,
            "n_groups": self.n_groups,
            "probes": [{"name": p.name, "dimension": p.dimension, "value": p.value, "level": p.level,
                        "warn": p.warn, "critical": p.critical, "direction": p.direction,
                        "examples": list(p.examples), **({"error": p.error} if p.error else {})}
                       for p in self.probes],
            "alerts": [p.name for p in self.alerts],
            "examples": {rid: asdict(ex) for rid, ex in self.examples.items()},
            **({"source_reported": self.source_reported} if self.source_reported else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HealthReport:
        probes = [ProbeResult(p["name"], p["dimension"], p["value"], p["level"], p["warn"], p["critical"],
                              p["direction"], tuple(p.get("examples", ())), p.get("error"))
                  for p in data["probes"]]
        examples = {rid: Example(**ex) for rid, ex in (data.get("examples") or {}).items()}
        return cls(probes, data["n_rollouts"], data["n_groups"], data.get("harness_version"),
                   data.get("scope", "all"), examples, int(data.get("source_reported") or 0))

    def to_markdown(self) -> str:
        from evotrainer.diagnose.render import report_markdown

        return report_markdown(self)


def _unwrap(row: StoredRollout | Rollout) -> Rollout:
    """The rollout a probe sees; a stored one carries the training step it was sampled at as
    `meta["train_step"]` (the store keeps it beside the rollout, not in it)."""
    if not isinstance(row, StoredRollout):
        return row
    if row.step is None:
        return row.rollout
    return replace(row.rollout, meta={**row.rollout.meta, "train_step": row.step})


def by_group(rollouts: Iterable[Rollout]) -> list[Rollout]:
    """Rollouts with each group's members together, groups in order of first appearance."""
    groups: dict[str, list[Rollout]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, []).append(r)
    return [r for members in groups.values() for r in members]


def _quiet_level(probe: Probe, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> int:
    """The probe's severity on a subset; a probe that cannot judge a subset says nothing."""
    try:
        return SEVERITY[probe.level(probe.evaluate(rollouts, rewards))]
    except HarnessError:
        return -1


def alert_examples(probe: Probe, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> tuple[str, ...]:
    """Up to MAX_EXAMPLES ids of rollouts on which the probe alone would alert, spread over groups
    (also what the agent tools' analysis returns as examples, evotrainer/tools/act.py)."""
    spans: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        spans.setdefault(r.group_id, []).append(i)
    ranked = []
    for order, idx in enumerate(spans.values()):
        severity = _quiet_level(probe, [rollouts[i] for i in idx], [rewards[i] for i in idx])
        if severity > 0:
            ranked.append((-severity, order, idx))
    ranked.sort(key=lambda t: t[:2])
    picks: list[list[str]] = []
    for _, _, idx in ranked[:MAX_EXAMPLES * 4]:
        hits = [rollouts[i].id for i in idx if _quiet_level(probe, [rollouts[i]], [rewards[i]]) > 0]
        picks.append(hits or [rollouts[idx[0]].id])
        if len(picks) >= MAX_EXAMPLES and all(picks):
            break
    out: list[str] = []
    depth = 0  # one per group first, then second picks, so examples span groups
    while len(out) < MAX_EXAMPLES and any(len(p) > depth for p in picks):
        out += [p[depth] for p in picks if len(p) > depth][: MAX_EXAMPLES - len(out)]
        depth += 1
    return tuple(out)


def _preview(r: Rollout) -> str:
    text = r.completion if r.completion.strip() or not r.turns else r.turns[-1].content
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def health_report(harness: IsolatedHarness | Harness, rows: Iterable[StoredRollout | Rollout], *, scope: str = "all",
                  examples: bool = True, task_stats: Sequence[TaskStats] | None = None) -> HealthReport:
    """Evaluate every probe of `harness` on `rows` (StoredRollouts or api Rollouts).

    `task_stats`: the per-task history the rows' round was drawn from; given, the report also
    holds the trusted `mid_band_weight` (the curriculum's own weights over it).
    A reward fault is a HarnessError (the harness under diagnosis cannot score these rollouts);
    a probe fault only marks that probe n/a with its error.
    """
    rollouts = by_group(_unwrap(row) for row in rows)
    rewards = [harness.training_reward(c) for c in harness.rewards(rollouts)]  # one request
    results = []
    for probe in harness.probes:
        try:
            value, error = probe.evaluate(rollouts, rewards), None
        except HarnessError as exc:
            value, error = None, redact(exc)  # harness-shaped text: it goes into the LLM agent's prompt
        level = probe.level(value)
        ids = alert_examples(probe, rollouts, rewards) if examples and level in ("warn", "critical") else ()
        results.append(ProbeResult(probe.name, probe.dimension, value, level, probe.warn, probe.critical,
                                   probe.direction, ids, error))
    results = [r for r in results if r.name != FALSE_DROP] + [_false_drops(harness, rollouts, rewards, examples)]
    if task_stats is not None:
        results = [r for r in results if r.name != MID_BAND] + [_mid_band(harness, task_stats)]
    index = {r.id: (r, w) for r, w in zip(rollouts, rewards)}
    shown = {}
    for result in results:
        for rid in result.examples:
            r, w = index[rid]
            shown[rid] = Example(r.id, r.task_id, r.group_id, r.outcome.kind, r.outcome.success, w,
                                 r.truncated, r.num_tokens, sum(t.role == "assistant" for t in r.turns),
                                 _preview(r))
    n_groups = len({r.group_id for r in rollouts})
    reported = sum(SOURCE_REPORTED in r.outcome.flags for r in rollouts)
    return HealthReport(results, len(rollouts), n_groups, harness.version, scope, shown, reported)


def _false_drops(harness: IsolatedHarness | Harness, rollouts: Sequence[Rollout], rewards: Sequence[float],
                 examples: bool) -> ProbeResult:
    """The trusted `false_drop_rate`: the share of verified successes the harness's own filters
    (keep_group and keep_rollout, as training calls them) would drop. No probe a harness writes
    can see this, since probes get the rollouts and rewards, not the filter decisions; a harness
    probe of the same name is replaced. None when there is no verified success."""
    spans: dict[str, list[int]] = {}
    for i, r in enumerate(rollouts):
        spans.setdefault(r.group_id, []).append(i)
    warn, critical = FALSE_DROP_THRESHOLDS
    try:
        kept = harness.filters([([rollouts[i] for i in idx], [rewards[i] for i in idx]) for idx in spans.values()])
    except HarnessError as exc:
        return ProbeResult(FALSE_DROP, "result", None, "n/a", warn, critical, "above", (), redact(exc))
    flags = {rollouts[i].id: k for idx, ks in zip(spans.values(), kept) for i, k in zip(idx, ks)}
    successes = [r for r in rollouts if r.outcome.success]
    if not successes:
        return ProbeResult(FALSE_DROP, "result", None, "n/a", warn, critical, "above")
    dropped = [r.id for r in successes if not flags[r.id]]
    value = len(dropped) / len(successes)
    level = "critical" if value > critical else "warn" if value > warn else "ok"
    shown = tuple(dropped[:MAX_EXAMPLES]) if examples and level != "ok" else ()
    return ProbeResult(FALSE_DROP, "result", value, level, warn, critical, "above", shown)


def _mid_band(harness: IsolatedHarness | Harness, task_stats: Sequence[TaskStats]) -> ProbeResult:
    """The trusted `mid_band_weight`: the mean weight the harness's curriculum gives the tasks
    the policy half-solves (at least MID_BAND_ATTEMPTS attempts, pass rate strictly between 0
    and 1) over the mean weight it gives every task of the history. About 1 for a uniform
    curriculum and above 1 for one that favours the mid band; near 0 for one that starves the
    tasks whose groups mix successes and failures, which are the groups GRPO learns from. No
    probe a harness writes can see this: probes get rollouts, not the curriculum's weights.
    None without a mid-band task in the history."""
    warn, critical = MID_BAND_THRESHOLDS
    stats = [s for s in task_stats if s.meta.get("split") != "heldout"]
    mid = [s.task_id for s in stats if s.attempts >= MID_BAND_ATTEMPTS and 0 < s.successes < s.attempts]
    if not mid:
        return ProbeResult(MID_BAND, "result", None, "n/a", warn, critical, "below")
    try:
        weights = harness.weights(stats)
    except HarnessError as exc:
        return ProbeResult(MID_BAND, "result", None, "n/a", warn, critical, "below", (), redact(exc))
    overall = sum(weights.get(s.task_id, 0.0) for s in stats) / len(stats)
    if overall <= 0:
        return ProbeResult(MID_BAND, "result", None, "n/a", warn, critical, "below")
    value = sum(weights.get(t, 0.0) for t in mid) / len(mid) / overall
    level = "critical" if value < critical else "warn" if value < warn else "ok"
    return ProbeResult(MID_BAND, "result", value, level, warn, critical, "below")


def write_report(report: HealthReport, folder: Path | str, name: str) -> tuple[Path, Path]:
    """Write `<folder>/<name>.md` and `.json`; return both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / f"{name}.md", folder / f"{name}.json"
    js.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    md.write_text(report.to_markdown(), encoding="utf-8")
    return md, js
