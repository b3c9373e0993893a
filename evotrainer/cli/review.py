"""`evotrainer review`: a person labels the rollouts the judges disagreed on, from the terminal."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import WorkdirOpt
from evotrainer.cli.judge import open_store
from evotrainer.console import make_console

CHOICES = {"s": "success", "f": "failure", "k": "skip", "q": "quit"}


def _clip(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} characters cut ...]"


def review_cmd(
    workdir: Path | None = WorkdirOpt,
    limit: int | None = typer.Option(None, "--limit", min=1, help="Label at most N rollouts."),
    list_only: bool = typer.Option(False, "--list", help="List the queue and exit."),
    show_outcome: bool = typer.Option(False, "--show-outcome", help="Also show the verified outcome "
                                      "(off by default, so human labels stay an independent check)."),
):
    """Label, one by one, the rollouts whose judge roles disagreed: s = success, f = failure,
    k = skip, q = quit; then an optional quality 1-5. A person's label becomes the rollout's judge
    label (`meta["judge"]`, source "human") and counts in backtests as the judges' human accuracy."""
    from evotrainer.judge import JudgeRecords, apply_human_label

    out = make_console()
    with open_store(workdir) as store:
        records = JudgeRecords(store)
        queue = records.reviews("pending", limit=limit)
        if list_only:
            table = Table(title=f"review queue ({len(queue)} pending)")
            for col in ("rollout", "reason", "votes"):
                table.add_column(col)
            for item in queue:
                votes = ", ".join(f"{role}: {v.get('success')}/{v.get('quality')}" for role, v in item.votes.items())
                table.add_row(item.rollout_id[:16], item.reason, votes)
            out.print(table)
            return
        if not queue:
            out.print("nothing to review")
            return
        done = 0
        for n, item in enumerate(queue, 1):
            stored = store.get_rollout(item.rollout_id)
            if stored is None:
                records.skip(item.rollout_id)
                continue
            r = stored.rollout
            body = r.completion or "\n\n".join(f"[{t.role}] {t.content}" for t in r.turns)
            out.print(Panel(Text(_clip(r.prompt)), title=f"{n}/{len(queue)} task {r.task_id} · rollout {r.id[:16]}"))
            out.print(Panel(Text(_clip(body, 3000)), title="response"))
            votes = Table(title="judge votes")
            for col in ("role", "success", "quality", "failure reason"):
                votes.add_column(col)
            for role, v in item.votes.items():
                votes.add_row(role, str(v.get("success")), str(v.get("quality")), str(v.get("failure_reason") or ""))
            out.print(votes)
            if show_outcome:
                out.print(f"verified outcome: {r.outcome.kind} (success={r.outcome.success})")
            choice = _ask("label: [s]uccess, [f]ailure, s[k]ip, [q]uit", _choice, out)
            if choice == "quit":
                break
            if choice == "skip":
                records.skip(item.rollout_id)
                continue
            quality = _ask("quality 1-5 (empty: none)", _quality, out, default="")
            apply_human_label(records, item.rollout_id, choice == "success", quality)
            done += 1
        left = len(records.reviews("pending"))
    out.print(f"labelled {done}; {left} still pending")


def _ask(question: str, read, out: Console, default: str | None = None):
    """Prompt until `read(answer)` accepts it (ValueError says why not)."""
    while True:
        answer = typer.prompt(question, default=default, show_default=False)
        try:
            return read(answer)
        except ValueError as exc:
            out.print(f"[red]{exc}[/red]")


def _choice(text: str) -> str:
    key = text.strip().lower()[:1]
    if key not in CHOICES:
        raise ValueError("answer s, f, k or q")
    return CHOICES[key]


def _quality(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if text not in {"1", "2", "3", "4", "5"}:
        raise ValueError("quality is a whole number from 1 to 5, or empty")
    return int(text)


__all__ = ["review_cmd"]
