"""The skill library: reusable harness interventions with a trigger, a parameter grid and evidence.

A skill is a folder `<name>/` holding `skill.yaml`, a `README.md` for people, and the Jinja
templates its intervention renders. Shipped skills come from the package (`paths.SKILLS_DIR`);
skills learned in a workspace live in `<workdir>/skills/<name>/` and override a shipped skill of
the same name, so a skill marked `validated` or `failed` in one run is seen that way by the next.
"""

from __future__ import annotations

import copy
import itertools
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

import yaml
from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from evotrainer.errors import EvotrainerError, UserError
from evotrainer.harness.loader import SPEC_FILE
from evotrainer.paths import SKILLS_DIR
from evotrainer.skills import schema

SKILL_FILE = "skill.yaml"
STATUSES = get_args(schema.Status)
OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}
EVIDENCE_KEYS = ("run", "round", "backtest", "commit", "domain", "note", "params", "metrics")


class SkillError(UserError, ValueError):
    """A skill that cannot be parsed or rendered; the message names the skill and the field."""


def _block(name: str) -> re.Pattern[str]:
    """A skill's block in a harness file, written by its templates between `# >>> skill: NAME`
    and `# <<< skill: NAME` lines (blank lines before it included)."""
    n = re.escape(name)
    return re.compile(rf"\n*^# >>> skill: {n}(?![\w-]).*?^# <<< skill: {n}(?![\w-])[^\n]*(?:\n|\Z)", re.M | re.S)


def strip_block(text: str, name: str) -> str:
    """`text` without this skill's earlier block, so re-rendering retunes instead of stacking."""
    pattern = _block(name)
    return pattern.sub("\n\n", text).rstrip("\n") + "\n" if pattern.search(text) else text


@dataclass(frozen=True)
class Trigger:
    probe: str
    op: str
    value: float

    def check(self, report: Any) -> tuple[bool, Any]:
        """(fires, the probe's result) on a HealthReport (or its JSON); a missing or n/a probe never fires."""
        result = _probe_result(report, self.probe)
        value = getattr(result, "value", None)
        return (value is not None and OPS[self.op](value, self.value)), result

    def describe(self) -> str:
        return f"{self.probe} {self.op} {self.value:g}"


def _probe_result(report: Any, name: str) -> Any:
    if isinstance(report, Mapping):
        from evotrainer.diagnose.health import HealthReport

        report = HealthReport.from_json(report)
    return report.get(name) if report is not None else None


@dataclass(frozen=True)
class Edit:
    """One file edit: render `template` into `file`, and/or `set` dotted YAML keys in it."""

    file: str
    template: str | None = None
    set: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Skill:
    name: str
    summary: str
    triggers: tuple[Trigger, ...]
    intervention: tuple[Edit, ...]
    grid: Mapping[str, tuple[Any, ...]]
    expected: Mapping[str, Any]  # metric, direction (increase|decrease), note
    validation: Mapping[str, Any]  # targets (a backtest metric), optional margin
    domains: tuple[str, ...]
    status: str
    evidence: tuple[Mapping[str, Any], ...] = ()
    default_on: bool = True
    path: Path | None = None
    source: str = "shipped"  # "shipped" | "workspace"
    readme: str = ""
    templates: Mapping[str, str] = field(default_factory=dict)  # template file -> text

    @property
    def trigger(self) -> Trigger:
        return self.triggers[0]

    @property
    def targets(self) -> str:
        """The backtest metric this skill's proposals name in their Targets trailer."""
        return self.validation.get("targets") or self.expected.get("metric", "")

    @property
    def slug(self) -> str:
        """The name as a Python identifier fragment, for the names its templates define."""
        return self.name.replace("-", "_")

    def fired(self, report: Any) -> list[tuple[Trigger, Any]]:
        """The triggers that fire on `report`, with the probe results they read."""
        out = []
        for trig in self.triggers:
            fires, result = trig.check(report)
            if fires:
                out.append((trig, result))
        return out

    def triggered(self, report: Any) -> bool:
        return bool(self.fired(report))

    def applies_to(self, domain: str) -> bool:
        return domain in self.domains or "any" in self.domains

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, in file order ([{}] for an empty grid)."""
        keys = list(self.grid)
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.grid[k] for k in keys))]

    def render(self, current: Mapping[str, str], params: Mapping[str, Any]) -> dict[str, str]:
        """The new full text of each file the intervention edits, given the current harness sources.

        Templates see `current` (the sources, with this skill's own earlier block removed, so a
        second render retunes instead of stacking), `params` and each param by name, `skill`,
        `slug` (a Python identifier fragment) and `spec` (harness.yaml, parsed). Edits apply in
        order; a later edit of the same file sees the earlier one's result.
        """
        missing = [k for k in self.grid if k not in params]
        if missing:
            raise SkillError(f"skill {self.name}: missing param(s) {', '.join(missing)}")
        sources = {k: strip_block(v, self.name) if k.endswith(".py") else v for k, v in current.items()}
        edited: dict[str, str] = {}
        env = _env()
        for edit in self.intervention:
            spec = _spec(sources)
            context = {**params, "params": dict(params), "current": dict(sources), "skill": self.name,
                       "slug": self.slug, "spec": spec}
            text = sources.get(edit.file)
            if edit.template is not None:
                try:
                    text = env.from_string(self.templates[edit.template]).render(**context)
                except (TemplateError, KeyError, TypeError, ValueError) as exc:
                    raise SkillError(f"skill {self.name}: rendering {edit.template}: "
                                     f"{type(exc).__name__}: {exc}") from None
            if edit.set:
                if text is None:
                    raise SkillError(f"skill {self.name}: {edit.file} is not in the harness")
                for key, value in edit.set.items():
                    text = set_yaml_key(text, key, _render_value(env, value, context, self.name))
            sources[edit.file] = edited[edit.file] = text
        return edited

    def to_yaml(self) -> dict[str, Any]:
        trig = [{"probe": t.probe, "op": t.op, "value": t.value} for t in self.triggers]
        return {
            "name": self.name, "summary": self.summary,
            "trigger": trig[0] if len(trig) == 1 else trig,
            "intervention": [{k: v for k, v in (("file", e.file), ("template", e.template),
                                                 ("set", dict(e.set) if e.set else None)) if v is not None}
                             for e in self.intervention],
            "grid": {k: list(v) for k, v in self.grid.items()},
            "expected": dict(self.expected), "validation": dict(self.validation),
            "domains": list(self.domains), "status": self.status, "default_on": self.default_on,
            "evidence": [dict(e) for e in self.evidence],
        }


def _env() -> SandboxedEnvironment:
    return SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)


def _spec(sources: Mapping[str, str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(sources.get(SPEC_FILE, "")) or {}
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _render_value(env: SandboxedEnvironment, value: Any, context: Mapping[str, Any], name: str) -> Any:
    """A `set` value: strings are Jinja templates whose output is read back as YAML ("0.1" -> 0.1)."""
    if not isinstance(value, str):
        return value
    try:
        text = env.from_string(value).render(**context)
        return yaml.safe_load(text) if text.strip() else text
    except (TemplateError, yaml.YAMLError, TypeError, ValueError) as exc:
        raise SkillError(f"skill {name}: set value {value!r}: {exc}") from None


# ---------------------------------------------------------------- YAML key edits


class _Unsupported(EvotrainerError):
    pass


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[:-3].strip() if text.endswith("...") else text


def _line_edit(text: str, keys: list[str], value: Any) -> str:
    """Set a dotted key in block-style YAML by editing lines, so comments and order survive."""
    lines = text.splitlines()
    start, end, parent_indent = 0, len(lines), -1
    for depth, key in enumerate(keys):
        child_indent, found, last_content = None, None, start - 1
        for i in range(start, end):
            stripped = lines[i].strip()
            if not stripped or stripped.startswith("#"):
                continue
            indent = len(lines[i]) - len(lines[i].lstrip(" "))
            last_content = i
            if child_indent is None:
                child_indent = indent
            if indent == child_indent and re.match(rf"{re.escape(key)}\s*:(\s|$)", stripped):
                found = i
                break
        if found is None:
            indent = child_indent if child_indent is not None else parent_indent + 2 if parent_indent >= 0 else 0
            rest = keys[depth:]
            new = [" " * (indent + 2 * j) + f"{k}:" for j, k in enumerate(rest[:-1])]
            new.append(" " * (indent + 2 * (len(rest) - 1)) + f"{rest[-1]}: {_scalar(value)}")
            at = max(last_content + 1, start) if depth else len(lines)
            if not depth:
                while at > 0 and not lines[at - 1].strip():
                    at -= 1
            lines[at:at] = new
            return "\n".join(lines) + "\n"
        if depth == len(keys) - 1:
            lines[found] = " " * child_indent + f"{key}: {_scalar(value)}"
            return "\n".join(lines) + "\n"
        after = lines[found].split(":", 1)[1].strip()
        if after and not after.startswith("#"):
            raise _Unsupported(f"{key} is not a block mapping")
        parent_indent, start = child_indent, found + 1
        end = next((j for j in range(start, end) if lines[j].strip() and not lines[j].lstrip().startswith("#")
                    and len(lines[j]) - len(lines[j].lstrip(" ")) <= child_indent), end)
    raise _Unsupported("empty key")


def set_yaml_key(text: str, dotted: str, value: Any) -> str:
    """`text` with `a.b.c` set to `value`. Comments and layout are kept when the file is plain
    block YAML; otherwise the file is re-dumped. The result always parses to the intended data."""
    keys = dotted.split(".")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise SkillError(f"cannot set {dotted}: the YAML does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise SkillError(f"cannot set {dotted}: the YAML is not a mapping")
    expected = copy.deepcopy(data)
    node = expected
    for key in keys[:-1]:
        if not isinstance(node.get(key, {}), dict):
            raise SkillError(f"cannot set {dotted}: {key} is not a mapping")
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    try:
        edited = _line_edit(text, keys, value)
        if yaml.safe_load(edited) == expected:
            return edited
    except (_Unsupported, yaml.YAMLError):
        pass
    return yaml.safe_dump(expected, sort_keys=False)


# ---------------------------------------------------------------- parsing


def parse_skill(folder: Path, source: str = "shipped") -> Skill:
    """Read and validate `<folder>/skill.yaml` and the files it names."""
    where = folder / SKILL_FILE
    try:
        raw = yaml.safe_load(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SkillError(f"{where}: cannot read: {exc}") from None
    try:
        checked = schema.read(raw)
    except ValueError as exc:
        raise SkillError(f"{where}: {exc}") from None
    if checked.name != folder.name:
        raise SkillError(f"{where}: name: {checked.name!r} differs from its folder {folder.name!r}")
    readme = folder / "README.md"
    return Skill(
        name=checked.name, summary=" ".join(checked.summary.split()),
        triggers=tuple(Trigger(t.probe, t.op, t.value) for t in checked.trigger),
        intervention=tuple(Edit(e.file, e.template, e.set) for e in checked.intervention),
        grid={k: tuple(v) for k, v in checked.grid.items()},
        expected=checked.expected.model_dump(), validation=checked.validation.model_dump(exclude_unset=True),
        domains=tuple(checked.domains), status=checked.status, evidence=tuple(checked.evidence),
        default_on=checked.default_on, path=folder, source=source,
        readme=readme.read_text(encoding="utf-8") if readme.is_file() else "",
        templates=_templates(folder, checked.intervention))


def _templates(folder: Path, edits: Sequence[schema.EditFile]) -> dict[str, str]:
    """The text of each template the edits name, each checked to parse as Jinja."""
    where, out = folder / SKILL_FILE, {}
    for i, edit in enumerate(edits):
        if edit.template is None:
            continue
        path = folder / edit.template
        if not path.is_file():
            raise SkillError(f"{where}: intervention[{i}].template: {edit.template!r} not found in {folder}")
        out[edit.template] = path.read_text(encoding="utf-8")
        try:
            _env().parse(out[edit.template])
        except TemplateError as exc:
            raise SkillError(f"{where}: intervention[{i}].template: {edit.template}: {exc}") from None
    return out


# ---------------------------------------------------------------- the library


class SkillLibrary:
    """Shipped skills plus a workspace's learned ones (which win on a name clash)."""

    def __init__(self, skills: Mapping[str, Skill], errors: Sequence[str] = ()) -> None:
        self.skills = dict(sorted(skills.items()))
        self.errors = list(errors)  # workspace skills that did not parse, skipped

    @classmethod
    def load(cls, workdir: Path | str | None = None, shipped: Path | str = SKILLS_DIR) -> SkillLibrary:
        """Shipped skills must parse (a SkillError otherwise); a broken workspace skill is skipped
        and named in `errors`, so one bad learned skill does not stop a run."""
        skills: dict[str, Skill] = {}
        for folder in _skill_dirs(Path(shipped)):
            skill = parse_skill(folder, "shipped")
            skills[skill.name] = skill
        errors = []
        if workdir is not None:
            for folder in _skill_dirs(Path(workdir) / "skills"):
                try:
                    skill = parse_skill(folder, "workspace")
                except SkillError as exc:
                    errors.append(str(exc))
                    continue
                skills[skill.name] = skill
        return cls(skills, errors)

    def __iter__(self) -> Iterator[Skill]:
        return iter(self.skills.values())

    def __len__(self) -> int:
        return len(self.skills)

    def __contains__(self, name: object) -> bool:
        return name in self.skills

    def get(self, name: str) -> Skill:
        if name not in self.skills:
            raise SkillError(f"no skill named {name!r} (known: {', '.join(self.skills)})")
        return self.skills[name]

    def filter(self, domain: str | None = None, status: str | None = None) -> list[Skill]:
        return [s for s in self if (domain is None or s.applies_to(domain)) and (status is None or s.status == status)]

    def search(self, text: str) -> list[Skill]:
        """Skills mentioning every word of `text` in name, summary or README, best match first."""
        words = [w for w in re.findall(r"\w+", text.lower()) if w]
        scored = []
        for skill in self:
            fields = ((skill.name.replace("-", " "), 3), (skill.summary.lower(), 2), (skill.readme.lower(), 1))
            if not all(any(w in f for f, _ in fields) for w in words):
                continue
            scored.append((-sum(weight * f.count(w) for w in words for f, weight in fields), skill.name, skill))
        return [s for *_, s in sorted(scored, key=lambda t: t[:2])]


def _skill_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith(".") and (p / SKILL_FILE).is_file()]


def save_learned(workdir: Path | str, skill: Skill, status: str,
                 evidence: Mapping[str, Any] | Iterable[Mapping[str, Any]] = ()) -> Skill:
    """Write `skill` to `<workdir>/skills/<name>/` with a new status and evidence appended to what
    the workspace copy (or else the skill) already holds; return it as reloaded from there."""
    if status not in STATUSES:
        raise SkillError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    entries = [evidence] if isinstance(evidence, Mapping) else list(evidence)
    for e in entries:
        unknown = sorted(set(e) - set(EVIDENCE_KEYS))
        if unknown:
            raise SkillError(f"evidence key(s) {', '.join(unknown)} not one of {', '.join(EVIDENCE_KEYS)}")
    dest = Path(workdir) / "skills" / skill.name
    old = dest.with_name(f".{skill.name}.old")
    if old.is_dir() and not dest.exists():  # a kill came between the two renames below
        old.rename(dest)
    prior = skill
    if (dest / SKILL_FILE).is_file():
        try:
            prior = parse_skill(dest, "workspace")
        except SkillError:
            pass
    plain = [yaml.safe_load(yaml.safe_dump(dict(e))) for e in entries]  # JSON-ish types only
    # The same evidence twice is one fact (a resumed run saving what its killed attempt saved).
    plain = [e for i, e in enumerate(plain) if e not in prior.evidence and e not in plain[:i]]
    updated = replace(skill, status=status, evidence=tuple(prior.evidence) + tuple(plain))
    staging = dest.with_name(f".{skill.name}.tmp")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for template, text in skill.templates.items():
        (staging / template).write_text(text, encoding="utf-8")
    if skill.readme:
        (staging / "README.md").write_text(skill.readme, encoding="utf-8")
    (staging / SKILL_FILE).write_text(yaml.safe_dump(updated.to_yaml(), sort_keys=False, allow_unicode=True),
                                      encoding="utf-8")
    if dest.exists():  # swapped in whole, so a crash never leaves a half-written skill
        if old.exists():
            shutil.rmtree(old)
        dest.rename(old)
        staging.rename(dest)
        shutil.rmtree(old)
    else:
        staging.rename(dest)
    return parse_skill(dest, "workspace")
