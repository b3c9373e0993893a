"""`evotrainer skills list|show|search`: the shipped skills plus those the workspace learned."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from evotrainer.cli.common import UserErrorGroup
from evotrainer.console import make_console
from evotrainer.errors import UserError
from evotrainer.skills.library import STATUSES, SkillLibrary

app = typer.Typer(name="skills", help="Browse the skill library: reusable, evidence-backed harness "
                  "interventions.", no_args_is_help=True, cls=UserErrorGroup)

Workdir = Annotated[Path | None, typer.Option(
    "--workdir", "-w", envvar="EVOTRAINER_WORKDIR",
    help="Workspace whose learned skills (WORKDIR/skills/) join and override the shipped ones.")]
DomainOpt = Annotated[str | None, typer.Option("--domain", "-d", help="Only skills for this domain.")]
Status = enum.Enum("Status", {s: s for s in STATUSES}, type=str)
StatusOpt = Annotated[Status | None, typer.Option("--status", "-s", help="Only skills with this status.")]


def _library(workdir: Path | None) -> SkillLibrary:
    if workdir is not None and not workdir.is_dir():  # a mistyped --workdir would hide its skills
        raise UserError(f"no workspace folder {workdir} (set by --workdir or EVOTRAINER_WORKDIR)")
    lib = SkillLibrary.load(workdir)
    err = make_console(stderr=True)
    for message in lib.errors:
        err.print(Text.assemble(("skipped: ", "yellow"), message))
    return lib


def _where(workdir: Path | None) -> str:
    return f"shipped + {workdir / 'skills'}" if workdir else "shipped"


@app.command("list")
def list_cmd(workdir: Workdir = None, domain: DomainOpt = None, status: StatusOpt = None) -> None:
    """Every skill: status, domains, trigger, targeted metric. `*` marks a workspace skill."""
    from evotrainer.skills.render import skills_table

    skills = _library(workdir).filter(domain, status.value if status else None)
    make_console().print(skills_table(skills, f"{len(skills)} skill(s) ({_where(workdir)})"))


@app.command("show")
def show_cmd(name: Annotated[str, typer.Argument(help="Skill name.")], workdir: Workdir = None) -> None:
    """One skill in full: trigger, intervention, grid, expected effect, evidence and README."""
    from evotrainer.skills.render import skill_panel

    skill = _library(workdir).get(name)
    make_console().print(skill_panel(skill))


@app.command("search")
def search_cmd(text: Annotated[str, typer.Argument(help="Words to find in name, summary or README.")],
               workdir: Workdir = None, domain: DomainOpt = None) -> None:
    """Skills that mention every word of TEXT, best match first."""
    from evotrainer.skills.render import skills_table

    skills = [s for s in _library(workdir).search(text) if domain is None or s.applies_to(domain)]
    make_console().print(skills_table(skills, f"{len(skills)} skill(s) matching {text!r}"))
