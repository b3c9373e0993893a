"""`evotrainer mcp`: the round's agent tools over the Model Context Protocol on stdio."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from evotrainer.cli.common import ConfigOpt, OverridesArg, WorkdirOpt, resolve_workdir
from evotrainer.console import make_console
from evotrainer.errors import UserError


def mcp_cmd(
    workdir: Path | None = WorkdirOpt,
    run: str | None = typer.Option(None, "--run", help="Run to serve (default: the co-evolution run in "
                                   "WORKDIR/coevolve.json)."),
    round_index: int | None = typer.Option(None, "--round", help="Round to serve (default: the round that "
                                           "coevolve.json is on, the one waiting for proposals)."),
    max_calls: int | None = typer.Option(None, "--max-calls", min=1, help="Tool calls allowed (default: the "
                                         "loop's session file, else coevolve.external.max_calls)."),
    max_submissions: int | None = typer.Option(None, "--max-submissions", min=1, help="Candidates the agent "
                                               "may submit (default: as --max-calls, from max_submissions)."),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
):
    """Serve the round's agent tools (read, analyse, act) to any MCP client on stdin/stdout.

    Point a coding agent at it while `evotrainer coevolve --agent external` waits, e.g. for
    Claude Code: `claude mcp add evotrainer -- evotrainer mcp --workdir W`. Each MCP tool is one
    tool of the Toolbox (evotrainer/tools/), with its name, description and JSON schema; an error
    (bad arguments, a refused path, a held-out rollout, a failed backtest) comes back as a tool
    result with isError set. Nothing it serves can promote: the agent writes candidate branches,
    backtests them, submits at most N and calls finish_round; the loop gates them itself. Budgets,
    gate and store come from the loop's session file for the round (agent/RUN/round-K.session.json)
    when there is one and no --config or override is given, else from the config. Every call is
    logged in WORKDIR/agent/RUN/round-K.jsonl. Nothing but the protocol is written to stdout.
    """
    from evotrainer.config import load_config
    from evotrainer.propose.external import session_path
    from evotrainer.tools.mcp_server import Session, ToolboxThread, resolve_round, serve
    from evotrainer.workspace import Workspace

    wd = resolve_workdir(workdir)
    if not (wd / "harnesses" / ".git").is_dir():
        raise UserError(f"{wd}: not a workspace (no harnesses/ git repo); run `evotrainer init` or "
                        "`evotrainer coevolve` there first")
    run, k = resolve_round(wd, run, round_index)
    loop_session = session_path(wd, run, k)
    if loop_session.is_file() and config is None and not overrides:
        data = json.loads(loop_session.read_text(encoding="utf-8"))
        calls, subs = data["max_calls"], data["max_submissions"]
        gate, store_url, workers = data["gate"], data.get("store_url"), data.get("workers")
        source = str(loop_session)
    else:
        cfg = load_config(config, overrides or [], domain=None if config else Workspace(wd).domain)
        ext = cfg.coevolve.external
        calls, subs = ext.max_calls, ext.max_submissions
        gate, store_url, workers = cfg.gate.model_dump(mode="json"), cfg.store.url, cfg.executor.workers
        source = "the config"
    session = Session(wd, run, k, max_calls or calls, max_submissions or subs, gate, store_url, workers)
    try:
        ToolboxThread(session).close()  # fail here, as a one-line error, not inside the protocol
    except ValueError as exc:
        raise UserError(str(exc)) from None
    make_console(stderr=True).print(
        f"evotrainer mcp: run {run!r} round {k} in {wd} (budgets from {source}: {session.max_calls} calls, "
        f"{session.max_submissions} submission(s)); serving on stdio")
    serve(session)
