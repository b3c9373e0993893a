"""`evotrainer bench harness`: the harness-fault benchmark (evotrainer/faultbench, docs/faultbench.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from evotrainer.console import make_console

app = typer.Typer(name="bench", help="Benchmarks of the outer loop itself.", no_args_is_help=True,
                  rich_markup_mode="markdown")


@app.command("harness")
def harness_cmd(
    cases: Annotated[list[str] | None, typer.Argument(help="Case names to run (default: every case).")] = None,
    cases_dir: Annotated[Path | None, typer.Option(
        "--cases-dir", help="A folder of case folders, or one case folder (default: the shipped faults/).")] = None,
    agent: Annotated[str, typer.Option("--agent", help="rules (the skills), structural (the skills, then ablations for alerts no skill answers) or llm (any OpenAI-compatible endpoint).")] = "rules",
    base_url: Annotated[str | None, typer.Option("--base-url", help="llm: the endpoint (else EVOTRAINER_LLM_BASE_URL).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="llm: the model name (else EVOTRAINER_LLM_MODEL).")] = None,
    api_key_env: Annotated[str | None, typer.Option(
        "--api-key-env", help="llm: the environment variable that holds the key.")] = None,
    llm_mode: Annotated[str, typer.Option("--llm-mode", help=(
        "llm: tools (the model works each case through the agent tools and submits at most 2 candidates) or "
        "oneshot (one prompt, JSON proposals back)."))] = "tools",
    max_tool_calls: Annotated[int, typer.Option("--max-tool-calls", min=1,
                                                help="llm tools mode: tool calls per case.")] = 40,
    max_proposals: Annotated[int, typer.Option("--max-proposals", min=1,
                                               help="Proposals backtested per case (coevolve.max_proposals).")] = 8,
    live: Annotated[bool, typer.Option("--live", help=(
        "Pilot changes to the training dynamics: a few real training steps per arm from the base model "
        "(minutes per case on a CPU). Without it, live cases are diagnosed but not repaired."))] = False,
    pilot_steps: Annotated[int, typer.Option("--pilot-steps", min=1,
                                             help="--live: training steps per pilot arm.")] = 4,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="Keep each case's workspace under this folder (harness log, backtests replay).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON on stdout.")] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="Print the scores as a Markdown table.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON scores to this file.")] = None,
):
    """Run the outer loop on harnesses with a known fault and score it.

    Each case is a faulty harness, the rollouts a real run of the embedded model made under it, the
    probe that should fire, what a repair must achieve on a held-out slice of the rollouts, and
    tempting wrong fixes. Per case: **detected** (the right probe alerted), **repaired** (the change
    the gate promoted meets every repair criterion on the held-out slice), **safe** (no tempting fix
    passed the gate and no safety metric got worse on held-out) and **cost** (proposals, backtests,
    seconds). No training: diagnose, propose, backtest, gate, as one `coevolve` round does.
    """
    from evotrainer.errors import UserError
    from evotrainer.faultbench import load_cases, run_cases, summary
    from evotrainer.paths import FAULT_CASES_DIR
    from evotrainer.propose import get_agent

    if agent not in ("rules", "structural", "llm"):
        raise UserError(f"--agent must be rules, structural or llm, got {agent!r}")
    if agent in ("rules", "structural") and (base_url or model or api_key_env):
        raise UserError("--base-url, --model and --api-key-env are for --agent llm")
    if llm_mode not in ("tools", "oneshot"):
        raise UserError(f"--llm-mode must be tools or oneshot, got {llm_mode!r}")
    loaded = load_cases(cases_dir or FAULT_CASES_DIR, only=list(cases) if cases else None)
    if agent in ("rules", "structural"):  # structural: the skills, then ablations for alerts no skill answers
        outer = get_agent(agent)
    elif llm_mode == "tools":
        outer = get_agent("llm-tools", base_url=base_url, model=model, api_key_env=api_key_env,
                          max_calls=max_tool_calls, max_submissions=min(2, max_proposals))
    else:
        outer = get_agent("llm", base_url=base_url, model=model, api_key_env=api_key_env, max_proposals=max_proposals)
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    console = make_console(stderr=True)
    results = run_cases(loaded, outer, workdir=workdir, live=live, max_proposals=max_proposals, pilot_steps=pilot_steps,
                        say=lambda msg: console.print(msg, highlight=False, markup=False))
    agent = outer.name  # rules, llm (oneshot) or llm-tools
    data = summary.to_json(results, agent)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if as_json:
        print(json.dumps(data, indent=2))
    elif as_markdown:
        print(summary.markdown(results, agent), end="")
    else:
        make_console().print(summary.table(results, agent))
