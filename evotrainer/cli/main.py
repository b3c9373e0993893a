"""The `evotrainer` command line: one typer app, one sub-app per stage of the loop."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import typer
from rich.table import Table

from evotrainer.cli.backtest import app as backtests_app
from evotrainer.cli.backtest import backtest_cmd
from evotrainer.cli.bench import app as bench_app
from evotrainer.cli.common import ConfigOpt, DomainOpt, OverridesArg, UserErrorGroup, WorkdirOpt, resolve_workdir
from evotrainer.cli.diagnose import diagnose_cmd
from evotrainer.cli.domains import domains_cmd
from evotrainer.cli.experience import app as experience_app
from evotrainer.cli.export import app as export_app
from evotrainer.cli.grade import grade_cmd
from evotrainer.cli.harness import app as harness_app
from evotrainer.cli.judge import judge_cmd
from evotrainer.cli.mcp import mcp_cmd
from evotrainer.cli.report import report_cmd
from evotrainer.cli.review import review_cmd
from evotrainer.cli.rollouts import app as rollouts_app
from evotrainer.cli.skills import app as skills_app
from evotrainer.cli.status import status_cmd
from evotrainer.cli.tasks import app as tasks_app
from evotrainer.config import load_config
from evotrainer.console import make_console
from evotrainer.errors import UserError

app = typer.Typer(
    name="evotrainer",
    help="Train LLM agents with LoRA + GRPO while co-evolving the training harness.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # reflow docstring paragraphs in --help
    cls=UserErrorGroup,
)
console = make_console(stderr=True)


@app.command()
def init(domain: str | None = DomainOpt, workdir: Path | None = WorkdirOpt):
    """Create a workspace: a harness git repo seeded from the package's harnesses/DOMAIN, plus
    skills/ and backtests/. An existing workspace is left as it is."""
    from evotrainer.harness.repo import HarnessRepo
    from evotrainer.workspace import ensure_workspace

    domain = domain or "math"
    wd = resolve_workdir(workdir)
    existed = (wd / "harnesses" / ".git").is_dir()
    ws = ensure_workspace(wd, domain)
    main = HarnessRepo(ws.harnesses).log(limit=1)[0]
    table = Table(title=f"{'existing' if existed else 'new'} {domain} workspace {ws.root}", show_header=False)
    table.add_row("harnesses/", f"git repo, main at {main.short} ({main.subject})")
    table.add_row("", ", ".join(sorted(HarnessRepo(ws.harnesses).sources())))
    table.add_row("skills/", "learned skills")
    table.add_row("backtests/", "backtest reports")
    table.add_row("store.db", "present" if ws.store_path.exists() else "created by the first train/eval")
    make_console().print(table)


@app.command()
def train(
    domain: str | None = DomainOpt,
    steps: int | None = typer.Option(None, "--steps", help="GRPO steps per round (train.steps_per_round)."),
    rounds: int | None = typer.Option(None, "--rounds", help="Rounds to run now (train.rounds)."),
    workdir: Path | None = WorkdirOpt,
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
):
    """Train the policy with GRPO + LoRA under the harness; resumes an existing run in WORKDIR.

    Every rollout is stored as it is scored, the held-out split is evaluated (greedy, fixed seeds)
    before the first round and after every round, and one LoRA adapter is saved per round.
    """
    from evotrainer.train.loop import open_session, run_training

    cfg = load_config(config, overrides or [], domain=domain)
    wd = resolve_workdir(workdir)
    session = open_session(cfg, wd, console)
    result = run_training(session, rounds=rounds, steps=steps)
    _print_train_summary(session, result)


def _print_train_summary(session, result) -> None:
    table = Table(title=f"run {session.config.run_name!r} in {session.workdir}")
    for col in ("round", "held-out success", "train reward", "train success", "s/step", "adapter"):
        table.add_column(col)
    if result["base"]:
        base = statistics.fmean(r.success_rate for r in result["base"])
        table.add_row("base", f"{base:.3f}", "", "", "", "")
    for s in result["rounds"]:
        table.add_row(str(s.index), f"{s.heldout_success:.3f}", f"{s.train_reward:.3f}",
                      f"{s.train_success:.3f}", f"{s.step_time:.1f}", s.adapter)
    make_console().print(table)


@app.command()
def coevolve(
    domain: str | None = DomainOpt,
    rounds: int = typer.Option(3, "--rounds", help="Rounds to run (with --resume: the run's total)."),
    agent: str | None = typer.Option(None, "--agent", help="Outer agent: rules (default, "
                                        "offline), llm, or external (any MCP client via `evotrainer mcp`; "
                                        "the loop waits for it)."),
    workdir: Path | None = WorkdirOpt,
    approve: bool = typer.Option(False, "--approve", help="Pause before each promotion: show the diff "
                                 "and the backtest, and wait for yes/no."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed run at the stage it reached."),
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
):
    """Co-evolve policy and harness: train, verify, diagnose, propose, backtest, promote.

    Each round trains under the harness at `main`, checks last round's promotion on verified
    success on the validation split against a control arm (reverting it if that regressed beyond
    noise), diagnoses the round's rollouts, backtests every proposal on them (a change to the
    training dynamics also gets a short live pilot), and promotes at most one through the gate.
    The held-out split decides nothing: it is the final measure.
    """
    from evotrainer.coevolve import Coevolution

    extra = [f"coevolve.agent={agent}"] if agent else []
    cfg = load_config(config, (overrides or []) + extra, domain=domain)
    loop = Coevolution(cfg, resolve_workdir(workdir), console,
                       approve=_ask_approval if approve else None)
    state = loop.run(rounds, resume=resume)
    _print_run(state, cfg, loop.ws.root)


def _print_run(state, cfg, root: Path) -> None:
    """The run as a whole: held-out success by round, what was promoted, how each promotion
    fared in the next round's verification, and the skills that learned from it."""
    from evotrainer.store import Store

    with Store.open(root, cfg.store.url) as store:
        run_id = store.run_id(cfg.run_name)
        base = [e["success_rate"] for e in store.evals(run_id) if e["split"] == "heldout"
                and e["round_index"] is None and e["adapter"] is None] if run_id is not None else []
    table = Table(title=f"co-evolution run {cfg.run_name!r}: {len(state.history)} round(s)")
    for col in ("round", "held-out success", "passed / proposed", "promoted", "its verification next round"):
        table.add_column(col)
    verdicts = {h["round"] - 1: h.get("verified") for h in state.history}
    for h in state.history:
        hs = h.get("heldout_success")
        v = verdicts.get(h["round"])
        fate = ("" if not h.get("promoted") else "[dim]not yet verified[/]" if v is None
                else f"[green]kept[/]: {v['describe']}" if v["kept"] else f"[red]reverted[/]: {v['describe']}")
        table.add_row(str(h["round"]), f"{hs:.3f}" if hs is not None else "n/a", f"{h['passed']} / {h['proposals']}",
                      h.get("promoted") or "nothing", fate)
    out = make_console()
    out.print(table)
    if base:
        out.print(f"held-out success before training: {statistics.fmean(base):.3f}")
    learned = [f"{v['skill']} {'validated' if v['kept'] else 'failed'}" for v in verdicts.values()
               if v and v.get("skill")]
    out.print(f"skills learned: {', '.join(learned) or 'none'} (evotrainer skills list --workdir {root})")
    out.print(f"harness history: evotrainer harness log --workdir {root}; "
              f"report: evotrainer report --workdir {root}")


def _ask_approval(candidate, report, diff: str) -> bool:
    from rich.syntax import Syntax

    from evotrainer.backtest import render_markdown

    console.rule(f"[bold]approve {candidate.branch}?")
    console.print(Syntax(diff or "(no diff)", "diff", word_wrap=True))
    console.print(render_markdown(report))
    return typer.confirm(f"promote {candidate.branch} into main?", default=False, err=True)


@app.command("eval")
def eval_cmd(
    domain: str | None = DomainOpt,
    adapter: Path | None = typer.Option(None, "--adapter", help="LoRA adapter folder (PEFT format); none = base model."),
    workdir: Path | None = WorkdirOpt,
    config: Path | None = ConfigOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
    overrides: list[str] | None = OverridesArg,
):
    """Evaluate a policy on the held-out split: greedy decoding, one result per eval seed."""
    from evotrainer.policy import load_policy
    from evotrainer.train.evaluate import eval_backend_name
    from evotrainer.train.loop import evaluate_heldout, open_session

    cfg = load_config(config, overrides or [], domain=domain)
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise UserError(f"--adapter {adapter}: not a PEFT adapter folder (no adapter_config.json)")
    session = open_session(cfg, resolve_workdir(workdir), console)
    model = tokenizer = None  # a vLLM engine or a server generates on its own
    if eval_backend_name(cfg) == "hf" or cfg.domain.scaffold == "agent":
        model, tokenizer = load_policy(cfg.policy.model, adapter)
    results = evaluate_heldout(session, model, tokenizer, None, str(adapter) if adapter else None)
    rows = [{"seed": r.seed, "n": r.n, "successes": r.successes, "success_rate": r.success_rate,
             "kinds": dict(r.kinds)} for r in results]
    if as_json:
        print(json.dumps({"adapter": str(adapter) if adapter else None, "results": rows}, indent=2))
        return
    table = Table(title=f"held-out eval ({adapter or 'base model'})")
    for col in ("seed", "n", "success", "outcome kinds"):
        table.add_column(col)
    for r in rows:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(r["kinds"].items()))
        table.add_row(str(r["seed"]), str(r["n"]), f"{r['success_rate']:.3f}", kinds)
    make_console().print(table)


@app.command("config")
def config_cmd(
    domain: str | None = DomainOpt,
    config: Path | None = ConfigOpt,
    overrides: list[str] | None = OverridesArg,
):
    """Print the resolved config (after overrides) as YAML, or the error that rejects it."""
    import yaml

    cfg = load_config(config, overrides or [], domain=domain)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")


def quiet_libraries() -> None:
    """Library warnings and per-file progress bars drown the progress we show."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="trl")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except ImportError:
        pass


# The stages' commands, after this file's own (the order `--help` lists them in).
app.add_typer(rollouts_app, name="rollouts")
app.add_typer(harness_app, name="harness")
app.command("backtest")(backtest_cmd)
app.add_typer(backtests_app, name="backtests")
app.command("diagnose")(diagnose_cmd)
app.command("grade")(grade_cmd)
app.command("domains")(domains_cmd)
app.command("judge")(judge_cmd)
app.command("review")(review_cmd)
app.command("mcp")(mcp_cmd)
app.add_typer(skills_app, name="skills")
app.add_typer(experience_app, name="experience")
app.add_typer(tasks_app, name="tasks")
app.add_typer(bench_app, name="bench")
app.command("report")(report_cmd)
app.add_typer(export_app, name="export")
app.command("status")(status_cmd)


def main() -> None:
    """`evotrainer`: a UserError becomes one `Error:` line and exit 2 (cli.common.UserErrorGroup)."""
    quiet_libraries()
    if not sys.stderr.isatty():
        # typer draws usage errors in a rich panel 80 columns wide, splitting paths; off a
        # terminal click's own one-line "Error: ..." is what a log or a pipe should get.
        typer.core.HAS_RICH = False
    try:
        app()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: everything scored so far is in the store; run the same "
                      "command again to resume[/yellow]")
        sys.exit(130)


if __name__ == "__main__":
    main()
