"""`evotrainer experience list|show|search|distill`: the experience pool in a workspace's store."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import UserErrorGroup
from evotrainer.console import make_console
from evotrainer.errors import UserError
from evotrainer.experience.distill import SOURCES
from evotrainer.store import Store

app = typer.Typer(name="experience", no_args_is_help=True, cls=UserErrorGroup, help=(
    "The experience pool: lessons distilled from stored rollouts, which a harness can put into a "
    "share of training prompts (harness.yaml `experience`), retrieved by embedding similarity."))

WORKDIR_ENV, STORE_URL_ENV = "EVOTRAINER_WORKDIR", "EVOTRAINER_STORE_URL"
Workdir = Annotated[Path, typer.Option(
    "--workdir", "-w", envvar=WORKDIR_ENV,
    help=f"Workspace holding store.db (env {STORE_URL_ENV} picks any SQLAlchemy URL instead).")]
DomainOpt = Annotated[str | None, typer.Option("--domain", "-d", help="Only this domain (math, code, swe, ...).")]
Source = enum.Enum("Source", {s: s for s in SOURCES}, type=str)
DEFAULT_WORKDIR = Path("evotrainer-work")


def _open(workdir: Path, must_exist: bool = True) -> Store:
    url = os.environ.get(STORE_URL_ENV)
    if not url and must_exist and not (workdir / "store.db").exists():
        raise UserError(f"no store at {workdir / 'store.db'} (set --workdir or {WORKDIR_ENV})")
    return Store(url) if url else Store.open(workdir)


def _table(rows: list[dict], title: str, scores: list[float] | None = None) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("id", style="cyan", no_wrap=True)
    if scores is not None:
        table.add_column("score", justify="right")
    for name in ("domain", "source", "kind"):
        table.add_column(name, no_wrap=True)
    table.add_column("support", justify="right")
    table.add_column("lesson", overflow="fold")
    for i, row in enumerate(rows):
        cells = [row["id"]] + ([f"{scores[i]:.3f}"] if scores is not None else [])
        cells += [row["domain"], row["source"], row["kind"], str(row["support"])]
        table.add_row(*cells, Text(row["text"]))  # Text: a lesson's brackets are not markup
    return table


@app.command("list")
def list_cmd(workdir: Workdir = DEFAULT_WORKDIR, domain: DomainOpt = None,
             source: Annotated[Source | None, typer.Option("--source", help="Only lessons from this distiller.")] = None,
             limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="At most this many.")] = 50) -> None:
    """Stored lessons, best supported first."""
    with _open(workdir) as store:
        rows = store.lessons(domain=domain, source=source.value if source else None, limit=limit)
    make_console().print(_table(rows, f"{len(rows)} lesson(s)"))


@app.command("show")
def show_cmd(lesson: Annotated[str, typer.Argument(help="Lesson id (or a unique prefix).")],
             workdir: Workdir = DEFAULT_WORKDIR) -> None:
    """One lesson in full: text, where it came from, and the rollouts behind it."""
    with _open(workdir) as store:
        try:
            row = store.get_lesson(lesson)
        except ValueError as exc:  # an ambiguous prefix
            raise UserError(str(exc)) from None
    if row is None:
        raise UserError(f"no lesson {lesson!r}")
    body = Text.assemble(
        (row["text"], "bold"), "\n\n",
        f"domain {row['domain']}  source {row['source']}  kind {row['kind']}  support {row['support']}\n",
        f"created {row['created_at']}  updated {row['updated_at']}\n",
        f"meta {row['meta']}\n",
        f"evidence ({len(row['evidence'])} rollout(s)): {' '.join(row['evidence'][:20])}",
        " ..." if len(row["evidence"]) > 20 else "")
    make_console().print(Panel(body, title=f"lesson {row['id']}", title_align="left"))


@app.command("search")
def search_cmd(text: Annotated[str, typer.Argument(help="What to look for, in words.")],
               workdir: Workdir = DEFAULT_WORKDIR, domain: DomainOpt = None,
               k: Annotated[int, typer.Option("-k", min=1, help="How many lessons.")] = 5) -> None:
    """The lessons nearest to TEXT by embedding similarity (the offline all-MiniLM-L6-v2 model).
    Lesson embeddings are computed once and cached in the store."""
    from evotrainer.experience import ExperiencePool

    if not text.strip():
        raise UserError("give some text to search for")
    with _open(workdir) as store:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=make_console(stderr=True),
                      transient=True) as progress:
            progress.add_task("embedding lessons and query", total=None)
            hits = ExperiencePool(store).search(text, domain=domain, k=k)
    rows = [{"id": h.lesson.id, "domain": h.lesson.domain, "source": h.lesson.source, "kind": h.lesson.kind,
             "support": h.lesson.support, "text": h.lesson.text} for h in hits]
    make_console().print(_table(rows, f"{len(rows)} lesson(s) nearest to {text!r}", [h.score for h in hits]))


@app.command("distill")
def distill_cmd(
    workdir: Workdir = DEFAULT_WORKDIR,
    run: Annotated[str | None, typer.Option("--run", help="Only rollouts of the run with this name.")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="Only rollouts of round K.")] = None,
    domain: DomainOpt = None,
    agent: Annotated[Source, typer.Option("--agent", "-a", help="rules: from outcome kinds and flags; llm: a "
                                          "chat model behind an OpenAI-compatible endpoint.")] = Source.rules,
    min_support: Annotated[int, typer.Option("--min-support", min=1, help="rules: failures a rule needs.")] = 2,
    model: Annotated[str | None, typer.Option("--model", help="llm: model name (else EVOTRAINER_LLM_MODEL).")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="llm: endpoint (else EVOTRAINER_LLM_BASE_URL).")] = None,
    max_calls: Annotated[int, typer.Option("--max-calls", min=1, help="llm: at most this many requests.")] = 8,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Read at most this many rollouts.")] = None,
) -> None:
    """Distill lessons from stored rollouts into the pool (held-out rollouts are never read).
    A lesson distilled again updates its row instead of adding a copy."""
    from evotrainer.experience.distill import distill_store, get_distiller

    options = ({"min_support": min_support} if agent is Source.rules
               else {"model": model, "base_url": base_url, "max_calls": max_calls})
    try:
        distiller = get_distiller(agent.value, **options)
    except ValueError as exc:  # no model, no API key
        raise UserError(str(exc)) from None
    with _open(workdir) as store:
        run_id = None
        if run is not None:
            run_id = store.run_id(run)
            if run_id is None:
                raise UserError(f"no run named {run!r}")
        total = store.count_rollouts(run_id=run_id, round_index=round_, domain=domain)
        if limit is not None:
            total = min(total, limit)
        if total == 0:
            raise UserError("no stored rollouts match")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      console=make_console(stderr=True), transient=True) as progress:
            reading = progress.add_task("reading rollouts", total=total)
            if agent is Source.llm:
                asking = progress.add_task("asking the model", total=None)
                distiller.on_batch = lambda done, n: progress.update(asking, completed=done, total=n)
            summaries = distill_store(store, distiller, domain=domain, run_id=run_id, round_index=round_,
                                      limit=limit, on_rollout=lambda: progress.advance(reading))
    out = make_console()
    for s in summaries:
        out.print(f"[bold]{s.domain}[/bold]: {s.rollouts} rollouts in {s.groups} groups -> "
                  f"{len(s.drafts)} lesson(s): {s.added} new, {s.updated} updated")
        for d in s.drafts:
            out.print(Text.assemble(("  ", ""), (d.id, "cyan"), f"  [{d.kind}, support {d.support}]  ", d.text))
    for reason in getattr(distiller, "last_errors", []):
        make_console(stderr=True).print(Text.assemble(("note: ", "yellow"), reason))
