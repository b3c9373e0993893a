"""`evotrainer export`: a workspace's harness, at one commit, as another engine loads reward code."""

from __future__ import annotations

from pathlib import Path

import typer

from evotrainer.cli.common import UserErrorGroup, WorkdirOpt, resolve_workdir
from evotrainer.console import make_console

app = typer.Typer(name="export", help="Export the harness to another RL engine (verl).", no_args_is_help=True,
                  cls=UserErrorGroup)


@app.command("verl")
def verl_cmd(
    workdir: Path | None = WorkdirOpt,
    rev: str = typer.Option("main", "--rev", help="Harness revision to export (the promoted one: main)."),
    out: Path = typer.Option(Path("reward.py"), "--out", "-o", help="The module to write."),
):
    """Write a verl custom reward module for the harness at REV.

    Point verl at it with `reward.custom_reward_function.path=OUT` and
    `reward.custom_reward_function.name=compute_score` (or `compute_score_batch` with verl's batch
    reward manager). The module records the harness commit; its reward code runs only in an
    evotrainer sandbox worker in verl's process, after the workspace domain's check."""
    from evotrainer.integrations.verl import export_module

    wd = resolve_workdir(workdir)
    commit = export_module(wd, rev, out)
    make_console(stderr=True).print(f"wrote {out}: harness {rev} at {commit[:12]} (load it with "
                                    f"reward.custom_reward_function.path={out} name=compute_score)")
