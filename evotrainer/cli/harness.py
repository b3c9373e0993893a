"""`evotrainer harness`: read the harness history (log, show, diff) with its trailers as tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import UserErrorGroup
from evotrainer.console import make_console
from evotrainer.errors import UserError
from evotrainer.harness.repo import CommitInfo, HarnessRepo
from evotrainer.workspace import Workspace

app = typer.Typer(
    name="harness",
    help="Read the harness history: promotions on main, candidates on candidate/* branches.",
    no_args_is_help=True,
    cls=UserErrorGroup,
)

Workdir = Annotated[Path, typer.Option(
    "--workdir", "-w", envvar="EVOTRAINER_WORKDIR", help="Workspace holding harnesses/ (the harness git repo).")]
DEFAULT_WORKDIR = Path("evotrainer-work")


def _repo(workdir: Path) -> HarnessRepo:
    ws = Workspace(workdir)
    if not ws.exists():
        raise UserError(f"no harness repo at {ws.harnesses} (run `evotrainer init --domain D --workdir {workdir}`)")
    return HarnessRepo(ws.harnesses)


def trailer_table(info: CommitInfo) -> Table | None:
    if not info.trailers:
        return None
    table = Table(show_header=False, box=None, padding=(0, 1), expand=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in info.trailers.items():
        table.add_row(key, value)
    return table


def commit_panel(info: CommitInfo, with_body: bool = True) -> Panel:
    title = Text.assemble((info.short, "yellow"), "  ", (info.date.strftime("%Y-%m-%d %H:%M"), "dim"))
    if info.refs:
        title.append("  " + ", ".join(info.refs), style="bold green")
    if info.is_merge:
        title.append("  merge", style="magenta")
    parts: list = [Text(info.subject, style="bold")]
    if with_body and info.body:
        parts += [Text(), Text(info.body)]
    table = trailer_table(info)
    if table is not None:
        parts += [Text(), table]
    return Panel(Group(*parts), title=title, title_align="left", border_style="blue")


def _diff(text: str) -> Syntax | Text:
    if not text.strip():
        return Text("(no changes)", style="dim")
    return Syntax(text, "diff", theme="ansi_dark", word_wrap=True)


@app.command("log")
def log_cmd(
    workdir: Workdir = DEFAULT_WORKDIR,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Every branch (candidates too), every commit.")] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Newest N commits.")] = None,
):
    """The promotion history of main (first parent), newest first; --all adds the candidates."""
    repo = _repo(workdir)
    out = make_console()
    commits = repo.log(first_parent=not all_, branches=all_, limit=limit)
    for info in commits:
        out.print(commit_panel(info, with_body=False))
    if not all_:
        pending = [b for b in repo.candidates() if not repo.is_promoted(b)]
        if pending:
            out.print(Text(f"not promoted (see --all): {', '.join(pending)}", style="dim"))


@app.command("show")
def show_cmd(
    rev: Annotated[str, typer.Argument(help="A commit, branch (main, candidate/3-slug) or sha prefix.")],
    workdir: Workdir = DEFAULT_WORKDIR,
):
    """One commit: message, trailers and its diff against the first parent (for a promotion: what
    it changed on main)."""
    repo = _repo(workdir)
    info, patch = repo.show(rev)
    out = make_console()
    out.print(commit_panel(info))
    out.print(_diff(patch))


@app.command("diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="Old revision.")],
    b: Annotated[str, typer.Argument(help="New revision.")],
    workdir: Workdir = DEFAULT_WORKDIR,
):
    """The unified diff between two harness versions."""
    repo = _repo(workdir)
    text = repo.diff(a, b)
    make_console().print(_diff(text))
