"""`evotrainer status`: where a run stands: round, stage, last metrics, open candidates."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from evotrainer.cli.common import WorkdirOpt, resolve_workdir
from evotrainer.console import make_console
from evotrainer.errors import UserError


def _fmt(value: object) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _memory_line(path: Path) -> str:
    """What a run's replay memory holds: its size, its strata, its drift estimate."""
    import json

    from evotrainer.memory import ReplayMemory

    try:
        data = json.loads(path.read_text())
        memory = ReplayMemory.from_json(data["memory"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable ({exc})"
    strata = ", ".join(f"{k} {v}" for k, v in memory.strata_counts().items() if v)
    return (f"{len(memory)} of {memory.policy.capacity} tasks ({strata or 'empty'}); observed rounds "
            f"{data.get('observed', [])}; drift {memory.drift:+.2f} logit per round")


def status_cmd(workdir: Path | None = WorkdirOpt):
    """Show where the workspace's run stands: the co-evolution round and stage, the last
    finished round's metrics, a promotion waiting for verification, and this round's candidates."""
    from evotrainer.coevolve.state import describe_cost
    from evotrainer.report.gather import load_state
    from evotrainer.store import Store
    from evotrainer.workspace import Workspace

    ws = Workspace(resolve_workdir(workdir))
    if not ws.root.is_dir() or not (ws.store_path.exists() or ws.exists()):
        raise UserError(f"{ws.root}: no workspace here (run `evotrainer init` or `train`)")
    out = make_console()
    state = load_state(ws.root)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("workspace", str(ws.root))
    if state is not None:
        head.add_row("run", f"{state.run} ({state.domain}), co-evolution")
        head.add_row("round", str(state.round))
        head.add_row("stage", Text(state.stage, style="cyan"))
        if state.pending:
            p = state.pending
            head.add_row("pending", Text(f"{p.branch} promoted after round {p.round} (backtest {p.backtest}); "
                                         f"verified in round {p.round + 1}", style="yellow"))
        promoted = [h["promoted"] for h in state.history if h.get("promoted")]
        head.add_row("promoted so far", ", ".join(promoted) or "nothing")
    else:
        head.add_row("run", "no coevolve.json: a plain training workspace")
    last = None
    if ws.store_path.exists():
        with Store.open(ws.root) as store:
            for run_id, name in store.run_names().items():
                finished = [r for r in store.rounds(run_id) if r["finished_at"]]
                if finished and (state is None or name == state.run or last is None):
                    last = (name, finished[-1])
            total = store.count_rollouts()
        head.add_row("rollouts stored", str(total))
    for path in sorted((ws.root / "memory").glob("*.json")):  # harness.yaml memory (memory/run.py)
        head.add_row(f"memory {path.stem}", _memory_line(path))
    out.print(head)
    if last is not None:
        name, rnd = last
        metrics = rnd["metrics"] or {}
        table = Table(title=f"last finished round: {name} round {rnd['index']} (harness {rnd['harness_version'][:8]})",
                      title_justify="left")
        for key in ("heldout_success", "train_reward", "train_success", "step_time"):
            table.add_column(key.replace("_", " "), justify="right")
        table.add_row(*(_fmt(metrics.get(k)) for k in ("heldout_success", "train_reward", "train_success",
                                                       "step_time")))
        out.print(table)
        if metrics.get("stage_seconds") and not (state is not None and state.history):
            out.print(describe_cost(metrics["stage_seconds"], metrics.get("beside_seconds")))
    if state is not None and state.history and state.history[-1].get("stage_seconds"):
        h = state.history[-1]
        out.print(f"round {h['round']}: {describe_cost(h['stage_seconds'], h.get('beside_seconds'))}")
    if state is not None and state.stage_seconds:
        out.print(Text(f"round {state.round} so far ({state.stage} next): "
                       + describe_cost(state.stage_seconds, state.beside_seconds).split(": ", 1)[1], style="dim"))
    if state is not None and state.candidates:
        table = Table(title=f"round {state.round} candidates", title_justify="left")
        for col in ("branch", "targets", "backtest", "decision", "first reason"):
            table.add_column(col, overflow="fold")
        for c in state.candidates:
            colour = {"promote": "green", "reject": "red"}.get(c.decision or "", "yellow")
            table.add_row(c.branch, c.targets, c.backtest or "–", Text(c.decision or "open", style=colour),
                          Text((c.reasons or [""])[0][:80]))
        out.print(table)
    elif state is not None:
        out.print(Text(f"no open candidates in round {state.round}", style="dim"))
