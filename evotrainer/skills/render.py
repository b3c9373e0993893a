"""Skills for people: a rich table of many, a panel of one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from evotrainer.skills.library import Skill

STATUS_STYLE = {"validated": "green", "seed": "cyan", "failed": "red"}


def _triggers(skill: Skill) -> str:
    return " or ".join(t.describe() for t in skill.triggers)


def _grid(skill: Skill) -> str:
    return ", ".join(f"{k} ∈ {list(v)}" for k, v in skill.grid.items()) or "-"


def skills_table(skills: Sequence[Skill], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=True)
    table.add_column("name", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col, ratio in (("domains", 1), ("trigger", 2), ("targets", 2), ("summary", 5)):
        table.add_column(col, overflow="fold", ratio=ratio)
    for s in skills:
        name = Text(s.name)
        if not s.default_on:
            name.append(" (off)", style="dim")
        if s.source == "workspace":
            name.append(" *", style="magenta")
        table.add_row(name, Text(s.status, style=STATUS_STYLE.get(s.status, "")), ", ".join(s.domains),
                      _triggers(s), s.targets, s.summary)
    return table


def _evidence_table(evidence: Sequence[Any]) -> Table:
    table = Table(title="evidence", title_justify="left")
    keys = list(dict.fromkeys(k for e in evidence for k in e))
    for k in keys:
        table.add_column(k, overflow="fold")
    for e in evidence:
        table.add_row(*(str(e.get(k, "")) for k in keys))
    return table


def skill_panel(skill: Skill) -> Group:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    edits = "; ".join(
        f"{e.file}: " + " + ".join(([f"template {e.template}"] if e.template else [])
                                    + ([f"set {', '.join(e.set)}"] if e.set else []))
        for e in skill.intervention)
    for key, value in [
        ("summary", skill.summary),
        ("status", Text(skill.status, style=STATUS_STYLE.get(skill.status, ""))),
        ("source", f"{skill.source} ({skill.path})"),
        ("default on", "yes" if skill.default_on else "no (enable it in config: coevolve.enable_skills)"),
        ("domains", ", ".join(skill.domains)),
        ("trigger", _triggers(skill)),
        ("intervention", edits),
        ("grid", _grid(skill)),
        ("expected", f"{skill.expected.get('metric')} {skill.expected.get('direction')}: "
                     f"{' '.join(str(skill.expected.get('note', '')).split())}"),
        ("validation", ", ".join(f"{k} {v}" for k, v in skill.validation.items()) or "-"),
    ]:
        head.add_row(key, value if isinstance(value, Text) else Text(str(value)))
    parts: list[Any] = [Panel(head, title=Text(f"skill {skill.name}"), title_align="left")]
    if skill.evidence:
        parts.append(_evidence_table(skill.evidence))
    if skill.readme:
        parts.append(Panel(Markdown(skill.readme), title="README.md", title_align="left", border_style="dim"))
    return Group(*parts)
