"""The `rules` outer agent: triggered skills, rendered over their parameter grids. No network.

It reads the health report, keeps the skills whose trigger fires, that apply to the domain, that
have not failed, and that are on by default or enabled in config, and renders each grid point
into a Proposal. Its Targets are the metrics that judge the fired probes (diagnose/targets.py),
not the skill's own: the evidence says what a repair must move. It does not rank by expected
gain: the coevolve loop backtests every proposal and the gate decides, so the order here only
says which to try first when the loop caps the number per round (answers to safety evidence
first, whatever its level; then critical alerts before warnings, validated skills before seed
ones).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evotrainer.diagnose.targets import is_safety, targets_text
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessError
from evotrainer.propose.base import Evidence, Proposal, register_agent
from evotrainer.skills.library import Skill, SkillError, SkillLibrary

log = logging.getLogger(__name__)

SEVERITY = {"critical": 2, "warn": 1, "ok": 0, "n/a": -1}
STATUS_RANK = {"validated": 0, "seed": 1}
SLUG_MAX = 48  # HarnessRepo.propose's limit


def _token(value: Any) -> str:
    """A grid value as slug text: 0.05 -> 0p05, -1 -> m1, True -> on, [0.1, 0.9] -> 0p1-0p9."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (list, tuple)):
        return "-".join(_token(v) for v in value)
    text = str(value).lower().replace(".", "p").replace("-", "m")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "x"


def proposal_slug(skill: Skill, params: Mapping[str, Any]) -> str:
    """Skill name plus the params that vary in its grid, e.g. `partial-credit-format-weight-0p05`."""
    parts = [skill.name] + [f"{k.replace('_', '-')}-{_token(v)}" for k, v in params.items()
                            if len(skill.grid.get(k, ())) > 1]
    slug = re.sub(r"-+", "-", "-".join(parts))
    if len(slug) <= SLUG_MAX:
        return slug
    digest = hashlib.sha1(slug.encode()).hexdigest()[:6]
    return slug[: SLUG_MAX - 7].rstrip("-") + "-" + digest


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


@register_agent("rules")
class RulesAgent:
    """Skills whose triggers fire become proposals, one per grid point.

    `enable`: names of off-by-default skills (e.g. judge-step-attribution) this run may propose.
    `limit`: the most proposals to return (None: all).
    """

    name = "rules"

    def __init__(self, enable: Iterable[str] = (), limit: int | None = None) -> None:
        self.enable = frozenset(enable)
        self.limit = limit
        self.skipped: list[tuple[str, str]] = []  # (slug, why) of grid points not proposed

    def eligible(self, skill: Skill, domain: str) -> bool:
        return (skill.applies_to(domain) and skill.status != "failed"
                and (skill.default_on or skill.name in self.enable))

    def propose(self, evidence: Evidence, harness: Mapping[str, str],
                skills: Sequence[Skill] | Mapping[str, Skill] | SkillLibrary) -> list[Proposal]:
        """`skills`: a SkillLibrary, its `.skills` dict, or a list of Skill."""
        self.skipped = []
        ranked = []
        for order, skill in enumerate(skills.values() if isinstance(skills, Mapping) else skills):
            if not self.eligible(skill, evidence.domain):
                continue
            fired = skill.fired(evidence.report)
            if not fired:
                continue
            # The most severe fired trigger explains the proposal and orders it.
            trig, result = max(fired, key=lambda f: SEVERITY.get(getattr(f[1], "level", "ok"), 0))
            severity = SEVERITY.get(getattr(result, "level", "ok"), 0)
            diagnosis = self._diagnosis(skill, trig, result, fired)
            probes = [t.probe for t, r in sorted(fired, key=lambda f: -SEVERITY.get(getattr(f[1], "level", "ok"), 0))]
            targets = targets_text([trig.probe, *probes], skill.targets)
            for point, params in enumerate(skill.grid_points()):
                proposal = self._render(skill, params, harness, diagnosis, targets)
                if proposal is not None:
                    rank = (not is_safety(targets), -severity, STATUS_RANK.get(skill.status, 2), order, point)
                    ranked.append((rank, proposal))
        ranked.sort(key=lambda item: item[0])
        proposals = [p for _, p in ranked]
        return proposals[: self.limit] if self.limit is not None else proposals

    def _diagnosis(self, skill: Skill, trig: Any, result: Any, fired: list) -> str:
        level = getattr(result, "level", "?")
        thresholds = ""
        if result is not None and getattr(result, "warn", None) is not None:
            sign = ">" if result.direction == "above" else "<"
            thresholds = f"; probe alerts at warn {sign} {result.warn:g}, critical {sign} {result.critical:g}"
        others = [f"{t.probe} = {_fmt(getattr(r, 'value', None))}" for t, r in fired if t is not trig]
        also = f" Also fired: {', '.join(others)}." if others else ""
        return (f"{trig.probe} = {_fmt(getattr(result, 'value', None))} ({level}; skill {skill.name} "
                f"triggers at {trig.op} {trig.value:g}{thresholds}).{also} Skill ({skill.status}): {skill.summary}")

    def _render(self, skill: Skill, params: Mapping[str, Any], harness: Mapping[str, str],
                diagnosis: str, targets: str) -> Proposal | None:
        slug = proposal_slug(skill, params)
        try:
            edits = skill.render(harness, params)
        except SkillError as exc:
            return self._skip(slug, str(exc))
        changed = {f: t for f, t in edits.items() if harness.get(f) != t}
        if not changed:
            return self._skip(slug, "changes nothing in the current harness")
        try:  # loaded in a sandbox worker: main's harness may be code an LLM wrote
            with IsolatedHarness({**harness, **changed}, Path(f"<proposal {slug}>")) as proposal:
                proposal.check()
        except HarnessError as exc:
            return self._skip(slug, f"does not load: {exc}")
        exp = skill.expected
        settings = ", ".join(f"{k}={v}" for k, v in params.items())
        expected = (f"{exp['metric']} should {exp['direction']}"
                    + (f" (margin {skill.validation['margin']:g})" if "margin" in skill.validation else "")
                    + f": {' '.join(str(exp.get('note', '')).split())}")
        return Proposal(slug=slug, diagnosis=diagnosis + (f" Params: {settings}." if settings else ""),
                        edits=changed, targets=targets, expected=expected, skill=skill.name,
                        params=dict(params))

    def _skip(self, slug: str, why: str) -> None:
        log.info("rules agent: skipped %s: %s", slug, why)
        self.skipped.append((slug, why))
        return None


__all__ = ["RulesAgent", "proposal_slug"]
