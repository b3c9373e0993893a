"""Seconds per GRPO step of the swe domain with the `edit` scaffold against the `agent` scaffold,
the agent's episodes run one after another (domain.agent.batched=false) and as one batch.

Each run trains one round through train/loop.py's train_round (the real wiring: TRL's
rollout_func for agent) on the embedded model and the bundled pack, from the same seed; the step
time excludes model loading and held-out evaluation. Prints per run: seconds per step, the
outcome kinds and agent endings of the stored rollouts, and mean sampled tokens per rollout; then
the sequential agent step's time over the batched one's (and, with `agent-sequential-plain`, the
sequential path without train.decode_weights and train.shared_prefix over the batched one with them). Each step is split into generation,
the episodes' tool calls and test runs (the rollout function's time less its generation), and the
rest (the loss's forward and backward): the rest is the same work in both agent runs. Sampling differs between the two agent
runs (one RNG stream for the batch), so their endings and token counts differ too.

    python bench/agent_step.py [--steps 1] [--set domain.agent.max_turns=4 ...] [--runs agent-batched ...]

The settings are pinned to the ones this bench has always measured (levels 0-1, 4 generations at
temperature 1.0, 128 tokens, no gradient checkpointing), so its figures stay comparable while the
swe default (configs/swe.yaml, harnesses/swe) moves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

from evotrainer.cli.main import quiet_libraries
from evotrainer.config import load_config
from evotrainer.console import make_console
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.skills import set_yaml_key

PINNED = {"grpo.num_generations": 4, "grpo.temperature": 1.0, "grpo.max_completion_length": 128}
PINNED_CONFIG = ["domain.levels=[0,1]", "domain.options.heldout_fraction=0.2", "train.gradient_checkpointing=false"]


def pinned_harness(folder: Path) -> Path:
    """The seed swe harness with PINNED's knobs."""
    shutil.copytree(HARNESSES_DIR / "swe", folder)
    spec = folder / "harness.yaml"
    text = spec.read_text()
    for key, value in PINNED.items():
        text = set_yaml_key(text, key, value)
    spec.write_text(text)
    return folder


RUNS = {"edit": ["domain.scaffold=edit"],
        "agent-sequential": ["domain.scaffold=agent", "domain.agent.batched=false"],
        "agent-batched": ["domain.scaffold=agent", "domain.agent.batched=true"],
        # the sequential path without this round's step cuts: peft's layers while decoding, TRL's
        # log-prob pass over every whole row
        "agent-sequential-plain": ["domain.scaffold=agent", "domain.agent.batched=false",
                                   "train.decode_weights=false", "train.shared_prefix=false"]}


class Parts:
    """Seconds inside the agent scaffold's rollout function (the episodes: generation, tool calls,
    test runs) and in `generate` while the model trains (TRL's generation for edit; the episodes'
    for agent; evaluation switches the model to eval mode and is not counted). The rest of a
    step is the loss's forward and backward and TRL's bookkeeping."""

    def __init__(self) -> None:
        self.episodes = self.generation = 0.0

    @contextlib.contextmanager
    def timing(self):
        from transformers.generation.utils import GenerationMixin

        from evotrainer.train.rollout import AgentRollout

        generate, rollout = GenerationMixin.generate, AgentRollout.__call__
        parts = self

        def timed_generate(model, *args, **kwargs):
            started = time.perf_counter()
            try:
                return generate(model, *args, **kwargs)
            finally:
                if model.training:
                    parts.generation += time.perf_counter() - started

        def timed_rollout(self_, *args, **kwargs):
            started = time.perf_counter()
            try:
                return rollout(self_, *args, **kwargs)
            finally:
                parts.episodes += time.perf_counter() - started

        GenerationMixin.generate, AgentRollout.__call__ = timed_generate, timed_rollout
        try:
            yield self
        finally:
            GenerationMixin.generate, AgentRollout.__call__ = generate, rollout


def one(name: str, steps: int, overrides: list[str], workdir: Path, console: Console) -> dict:
    from evotrainer.policy import load_policy
    from evotrainer.store import Store
    from evotrainer.train.loop import build_peft, open_session, train_round
    from evotrainer.train.progress import make_progress

    harness = pinned_harness(workdir.parent / f"harness-{name}")
    cfg = load_config(CONFIGS_DIR / "swe.yaml", [*PINNED_CONFIG, f"harness={harness}", *RUNS[name],
                                                 "domain.heldout_size=1", "train.prompts_per_step=1",
                                                 f"run_name=bench-{name}", *overrides])
    session = open_session(cfg, workdir, console)
    # The evaluation after the steps is not timed: one validation task. Trimmed after the carve, so
    # the training tasks stay the ones domain.validation_size's split leaves (the bench's workload).
    session.validation = session.validation[:1]
    model, tokenizer = load_policy(cfg.policy.model, None, trainable=True)
    model = build_peft(model, session.grpo)
    with make_progress(console) as progress, Parts().timing() as parts:
        _, summary = train_round(session, model, tokenizer, 0, steps, progress)
    episodes = parts.episodes / steps
    generation = parts.generation / steps
    rows = list(Store.open(workdir).iter_rollouts(run_id=session.run_id))
    return {"run": name, "step_s": summary.step_time, "generation_s": generation,
            "tools_s": max(episodes - generation, 0.0),
            "rest_s": summary.step_time - (episodes if episodes else generation),
            "kinds": dict(Counter(r.rollout.outcome.kind for r in rows)),
            "endings": dict(Counter(r.rollout.meta.get("exit_status", "-") for r in rows)),
            "tokens": statistics.fmean(r.rollout.num_tokens for r in rows) if rows else 0.0,
            "rollouts": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="config override key.sub=value (every run)")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args()
    quiet_libraries()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    console = make_console(stderr=True)
    load = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="evo-agent-bench-") as tmp:
        for name in args.runs:
            results.append(one(name, args.steps, args.set, Path(tmp) / name, console))
    print(f"load average before: {load:.1f}  after: {os.getloadavg()[0]:.1f}  (cores: {os.cpu_count()})")
    print("| run | s/step | generation | tools and tests | loss and rest | rollouts | mean sampled tokens "
          "| outcome kinds | agent endings |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        print(f"| {r['run']} | {r['step_s']:.1f} | {r['generation_s']:.1f} | {r['tools_s']:.1f} | {r['rest_s']:.1f} | "
              f"{r['rollouts']} | {r['tokens']:.0f} | {r['kinds']} | {r['endings']} |")
    step = {r["run"]: r["step_s"] for r in results}
    if {"agent-sequential", "agent-batched"} <= set(step):
        print(f"agent step, sequential / batched: {step['agent-sequential'] / step['agent-batched']:.2f}x")
    if {"agent-sequential-plain", "agent-batched"} <= set(step):
        print(f"agent step, sequential without decode_weights and shared_prefix / batched with them: "
              f"{step['agent-sequential-plain'] / step['agent-batched']:.2f}x")


if __name__ == "__main__":
    main()
