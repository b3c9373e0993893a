"""The `structural` outer agent: the rules agent's skills, then ablations of the harness's own code
for the alerts no skill answers. No network, no LLM: delta debugging on the harness.

A fault no skill names (a bad reward term, a filter condition that throws away signal, a changed
default) still sits in some part of the harness. This agent reads the parts (each weighted reward
component in harness.yaml, each condition of each filter in filters.py, every value and file that
differs from the seed harness the workspace started from) and proposes removing or restoring
each, one at a time: zero one weight, remove one filter condition, restore one seed value, restore
one seed file (the curriculum's weights among them). Each is an ordinary single-variable
candidate, its diagnosis naming the part, its Targets the metrics that judge the uncovered alert
(diagnose/targets.py), so the backtest and the gate decide which ablation repairs it, exactly as
for a skill's proposal. It adds nothing when every alert has a skill whose trigger fires.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from evotrainer.diagnose.targets import targets_text
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import SPEC_FILE, HarnessError, read_sources
from evotrainer.paths import HARNESSES_DIR
from evotrainer.propose.base import Evidence, Proposal, register_agent
from evotrainer.propose.rules import SLUG_MAX, RulesAgent
from evotrainer.skills.library import SkillError, set_yaml_key

log = logging.getLogger(__name__)

FILTERS = "filters.py"
FILTER_FUNCTIONS = ("keep_rollout", "keep_group")
SEED_FILES = ("filters.py", "curriculum.py", "reward.py")
SEED_KEYS = ("grpo", "reward_weights")  # harness.yaml sections whose values a seed value may restore


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:SLUG_MAX].rstrip("-")


def _spec(sources: Mapping[str, str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(sources.get(SPEC_FILE, "")) or {}
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _flat(data: Mapping[str, Any], sections: Sequence[str]) -> dict[str, Any]:
    """`section.key` -> scalar value, for the named sections of a parsed harness.yaml."""
    out = {}
    for section in sections:
        values = data.get(section)
        if isinstance(values, dict):
            out.update({f"{section}.{k}": v for k, v in values.items() if not isinstance(v, (dict, list))})
    return out


def _replace(text: str, node: ast.AST, new: str) -> str:
    """`text` with the source of `node` replaced by `new` (ast positions: 1-based lines, 0-based
    UTF-8 byte columns)."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line.encode()) for line in lines[: node.lineno - 1]) + node.col_offset  # type: ignore[attr-defined]
    end = sum(len(line.encode()) for line in lines[: node.end_lineno - 1]) + node.end_col_offset  # type: ignore[attr-defined]
    raw = text.encode()
    return (raw[:start] + new.encode() + raw[end:]).decode()


def _statement_removed(text: str, node: ast.stmt) -> str:
    """`text` without the whole lines of statement `node`."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[: node.lineno - 1] + lines[node.end_lineno:])  # type: ignore[misc]


def _returns_false(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
            and isinstance(stmt.body[0], ast.Return) and isinstance(stmt.body[0].value, ast.Constant)
            and stmt.body[0].value.value is False)


def filter_ablations(text: str) -> Iterator[tuple[str, str, str]]:
    """(slug part, what is removed, new filters.py) for each condition of keep_rollout and
    keep_group: a guard `if <cond>: return False` removed; each operand of a returned `and`/`or`
    removed; a returned condition replaced by `True` (keep everything)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name not in FILTER_FUNCTIONS:
            continue
        for i, stmt in enumerate(fn.body):
            if _returns_false(stmt):
                cond = ast.get_source_segment(text, stmt.test) or "?"  # type: ignore[attr-defined]
                yield f"{fn.name}-guard-{i}", f"{fn.name}'s guard `if {cond}: return False`", \
                    _statement_removed(text, stmt)
            if not isinstance(stmt, ast.Return) or stmt.value is None:
                continue
            value = stmt.value
            if isinstance(value, ast.Constant) and value.value is True:
                continue
            if isinstance(value, ast.BoolOp):
                op = " and " if isinstance(value.op, ast.And) else " or "
                parts = [ast.get_source_segment(text, v) or "" for v in value.values]
                for j, part in enumerate(parts):
                    rest = [p for k, p in enumerate(parts) if k != j]
                    new = f"({op.join(rest)})" if len(rest) > 1 else rest[0]
                    yield f"{fn.name}-cond-{j}", f"{fn.name}'s condition `{part}`", _replace(text, value, new)
            whole = ast.get_source_segment(text, value) or "?"
            yield f"{fn.name}-all", f"{fn.name}'s whole test `{whole}` (keep everything)", _replace(text, value, "True")


@register_agent("structural")
class StructuralAgent:
    """Skills first (the rules agent), then ablations for the alerts no fired skill answers.

    `seed`: the seed harness's sources whose values and files an ablation may restore (default:
    `harnesses/<domain>/` where one ships). `enable`, `limit`: as for the rules agent.
    """

    name = "structural"

    def __init__(self, seed: Mapping[str, str] | None = None, enable: Sequence[str] = (),
                 limit: int | None = None) -> None:
        self.seed = seed
        self.rules = RulesAgent(enable=enable)
        self.limit = limit
        self.skipped: list[tuple[str, str]] = []
        self.uncovered: list[str] = []

    def propose(self, evidence: Evidence, harness: Mapping[str, str], skills: Any) -> list[Proposal]:
        proposals = self.rules.propose(evidence, harness, skills)
        self.skipped = list(self.rules.skipped)
        listed = list(skills.values() if isinstance(skills, Mapping) else skills)
        self.uncovered = self.uncovered_alerts(evidence, listed)
        if self.uncovered:
            proposals += self.ablations(evidence, harness)
        return proposals[: self.limit] if self.limit is not None else proposals

    def uncovered_alerts(self, evidence: Evidence, skills: Sequence[Any]) -> list[str]:
        """The alerting probes on which no eligible skill's trigger fires, most severe first."""
        report = evidence.report
        fired = {t.probe for s in skills if self.rules.eligible(s, evidence.domain) for t, _ in s.fired(report)}
        return [p.name for p in report.alerts if p.name not in fired]

    def _seed(self, domain: str) -> Mapping[str, str]:
        if self.seed is not None:
            return self.seed
        folder = HARNESSES_DIR / domain
        return read_sources(folder) if (folder / SPEC_FILE).is_file() else {}

    def ablations(self, evidence: Evidence, harness: Mapping[str, str]) -> list[Proposal]:
        report = evidence.report
        alerts = ", ".join(f"{p.name} = {p.value:.4g} ({p.level})" for p in report.alerts if p.name in self.uncovered)
        targets = targets_text(self.uncovered, "")
        out = []
        for slug, part, edits in self._candidates(harness, self._seed(evidence.domain)):
            diagnosis = (f"{alerts}: no skill's trigger answers it. Structural ablation: {part}. If the "
                         f"alert's metrics improve, that part of the harness caused it.")
            proposal = self._checked(slug, diagnosis, edits, harness, targets)
            if proposal is not None:
                out.append(proposal)
        return out

    def _candidates(self, harness: Mapping[str, str], seed: Mapping[str, str]) -> Iterator[tuple[str, str, dict]]:
        spec_text = harness.get(SPEC_FILE, "")
        spec, seed_spec = _spec(harness), _spec(seed)
        for name, weight in (spec.get("reward_weights") or {}).items():
            if isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight != 0:
                try:
                    text = set_yaml_key(spec_text, f"reward_weights.{name}", 0.0)
                except SkillError:
                    continue
                yield (f"ablate-weight-{name}", f"the reward component `{name}` (weight {weight:g}) zeroed",
                       {SPEC_FILE: text})
        mine, theirs = _flat(spec, SEED_KEYS), _flat(seed_spec, SEED_KEYS)
        for key, value in theirs.items():
            if key in mine and mine[key] != value:
                try:
                    text = set_yaml_key(spec_text, key, value)
                except SkillError:
                    continue
                yield f"restore-{key}", f"`{key}` restored to the seed's {value!r} (now {mine[key]!r})", {SPEC_FILE: text}
        if FILTERS in harness:
            for slug, part, text in filter_ablations(harness[FILTERS]):
                yield f"ablate-{slug}", part + " removed", {FILTERS: text}
        for name in SEED_FILES:
            if name in seed and name in harness and seed[name] != harness[name]:
                yield f"restore-{name.removesuffix('.py')}", f"{name} restored to the seed's", {name: seed[name]}

    def _checked(self, slug: str, diagnosis: str, edits: Mapping[str, str], harness: Mapping[str, str],
                 targets: str) -> Proposal | None:
        slug = _slug(slug)
        changed = {f: t for f, t in edits.items() if harness.get(f) != t}
        if not changed:
            self.skipped.append((slug, "changes nothing in the current harness"))
            return None
        try:  # loaded in a sandbox worker, as the rules agent's proposals are
            with IsolatedHarness({**harness, **changed}, Path(f"<proposal {slug}>")) as proposal:
                proposal.check()
        except HarnessError as exc:
            log.info("structural agent: skipped %s: %s", slug, exc)
            self.skipped.append((slug, f"does not load: {exc}"))
            return None
        return Proposal(slug=slug, diagnosis=diagnosis, edits=changed, targets=targets,
                        expected=f"{targets or 'the default targets'} improve with the part removed")


__all__ = ["StructuralAgent", "filter_ablations"]
