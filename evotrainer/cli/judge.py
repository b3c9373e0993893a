"""`evotrainer judge`: voting LLM judges over stored rollouts; verdicts go beside each rollout."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import WorkdirOpt, resolve_workdir
from evotrainer.console import make_console
from evotrainer.errors import UserError

err = make_console(stderr=True)


def open_store(workdir: Path | None):
    """The workspace's store (or $EVOTRAINER_STORE_URL); a UserError when there is none."""
    from evotrainer.store import Store
    from evotrainer.workspace import Workspace

    ws = Workspace(resolve_workdir(workdir))
    url = os.environ.get("EVOTRAINER_STORE_URL")
    if not url and not ws.store_path.exists():
        raise UserError(f"no store at {ws.store_path} (train first, or `evotrainer rollouts import`)")
    return Store(url) if url else Store.open(ws.root)


def judge_cmd(
    run: str | None = typer.Option(None, "--run", help="Only rollouts of this run (default: every stored rollout)."),
    round_: int | None = typer.Option(None, "--round", help="Only rollouts of round K."),
    domain: str | None = typer.Option(None, "--domain", "-d", help="Only rollouts of this domain."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Judge at most N rollouts."),
    steps: bool = typer.Option(False, "--steps", help="Also label each assistant step GOOD/BAD "
                               "(multi-turn rollouts; meta step_labels, for harness step_credit)."),
    workdir: Path | None = WorkdirOpt,
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config whose `judge:` section "
                                          "to use (default: configs/math.yaml)."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON on stdout."),
    overrides: list[str] | None = typer.Argument(None, help="Config overrides, e.g. judge.model=qwen "
                                                    "judge.base_url=http://127.0.0.1:8000/v1."),
):
    """Judge stored rollouts with the config's voting roles (`judge.roles`). Agreement labels a
    rollout success or failure, disagreement queues it for `evotrainer review`, a reply still
    malformed after `judge.max_retries` is MISSING (never a pass). The label lands in the rollout's
    `meta["judge"]` for harness rewards; verdicts are cached by (judge model, prompt hash, rollout
    id), so a second run asks nothing it asked before."""
    from evotrainer.config import load_config
    from evotrainer.judge import JudgePanel, JudgeRecords, StepJudge, make_backend

    cfg = load_config(config, overrides or []).judge
    try:
        backend = make_backend(cfg)
    except ValueError as exc:  # no model, no API key, an unknown backend
        raise UserError(str(exc)) from None
    labels: Counter = Counter()
    cached = asked = stepped = 0
    with open_store(workdir) as store:
        run_id = None
        if run is not None:
            run_id = store.run_id(run)
            if run_id is None:
                raise UserError(f"no run named {run!r}")
        records = JudgeRecords(store)
        panel = JudgePanel.from_config(cfg, backend, records)
        step_judge = StepJudge(backend, records=records, max_retries=cfg.max_retries, max_tokens=cfg.max_tokens,
                               max_chars=cfg.max_chars) if steps else None
        total = store.count_rollouts(run_id=run_id, round_index=round_, domain=domain)
        total = min(total, limit) if limit else total
        if total == 0:
            raise UserError("no rollouts match")
        columns = (TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, transient=True, disable=as_json) as progress:
            task = progress.add_task("judge", total=total)
            for sr in store.iter_rollouts(run_id=run_id, round_index=round_, domain=domain, limit=limit):
                result = panel.judge(sr.rollout)
                labels[result.label] += 1
                for vote in result.votes.values():
                    cached += vote.cached
                    asked += not vote.cached
                if step_judge is not None and any(t.role == "assistant" for t in sr.rollout.turns):
                    stepped += step_judge(sr.rollout) is not None
                progress.advance(task)
        pending = len(records.reviews("pending"))
    counts = {"rollouts": sum(labels.values()), **{k: labels.get(k, 0) for k in ("success", "failure", "disputed",
                                                                                   "missing")},
              "votes_asked": asked, "votes_cached": cached, "review_pending": pending, "model": backend.model}
    if steps:
        counts["step_labelled"] = stepped
    if as_json:
        typer.echo(json.dumps(counts, indent=2))
        return
    table = Table(title=f"judge {backend.model} ({', '.join(r.name for r in cfg.roles)})")
    names = [k for k in counts if k != "model"]
    for name in names:
        table.add_column(name, justify="right")
    table.add_row(*(str(counts[k]) for k in names))
    make_console().print(table)
    if pending:
        err.print(Text(f"{pending} rollout(s) wait for a person: evotrainer review -w {resolve_workdir(workdir)}",
                       style="yellow"))
