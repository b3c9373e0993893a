"""Our GRPO step (harness reward, filters, store writes) against a plain TRL GRPOTrainer script.

Same model, batch, lengths, seed and LoRA config; the plain script's reward is the same trusted
math check with no harness and no store. Runs alternate (plain, ours, plain, ours, ...) so that
machine drift hits both alike, and the first step of each run (warm-up) is dropped.
Prints per-step times and the ratio ours/plain (target: <= 1.10), both in fp32 with transformers'
generate. Our sides run with the audit on (train.audit_groups, train/audit.py), as our loop does.
A third side, `ours-<precision>-shrink-dw-sp`, runs our step as our loop does by default:
train.precision (`auto`: bf16 autocast for the loss's forward pass where the hardware multiplies
bf16 natively, train/precision.py), train.shrink_batch (sampling drops the rows that ended,
train/sampler.py), train.decode_weights (sampling with the adapter merged and the weights laid
out for decoding, train/decode_weights.py) and train.shared_prefix (the loss's log-prob pass runs
each distinct prompt once and scores only the completions, train/shared_prefix.py);
plain/that side is printed: how much faster our step is than plain TRL.

    python bench/inner_overhead.py [--steps 4] [--repeats 2] [--precision auto]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from transformers import PrinterCallback, TrainerCallback

from evotrainer.cli.main import quiet_libraries
from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR


class StepTimer(TrainerCallback):
    """Wall time per step, and what TRL logged about the step's completions: a step's cost follows
    how many tokens it generated, so a side that stops or drops completions early is cheaper."""

    def __init__(self):
        self.times: list[float] = []
        self.lengths: list[float] = []
        self.clipped: list[float] = []
        self._t = None

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t)

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "completions/mean_length" in logs:
            self.lengths.append(float(logs["completions/mean_length"]))
        if "completions/clipped_ratio" in logs:
            self.clipped.append(float(logs["completions/clipped_ratio"]))


def dataset(session, tasks):
    from datasets import Dataset

    prompts = session.harness.render_prompts([t.prompt for t in tasks])
    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}], "task_id": t.task_id}
                              for t, p in zip(tasks, prompts)])


def run_plain(session, tasks, steps, seed, workdir) -> list[float]:
    from trl import GRPOTrainer

    from evotrainer.policy import load_policy
    from evotrainer.train.loop import build_peft, grpo_args
    from evotrainer.train.recorder import completion_text

    by_id = {t.task_id: t for t in tasks}
    model, tok = load_policy("embedded")
    model = build_peft(model, session.grpo)
    eos = {tok.eos_token_id, tok.pad_token_id}

    def correct(prompts, completions, completion_ids, task_id, **_):
        return [float(session.domain.check(by_id[t], completion_text(c), not ids or ids[-1] not in eos).success)
                for t, c, ids in zip(task_id, completions, completion_ids)]

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=grpo_args(session, steps, seed, workdir),
                          train_dataset=dataset(session, tasks), processing_class=tok, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return timer


def run_ours(session, tasks, steps, seed, workdir, loss_dtype=None, fast=False) -> list[float]:
    from evotrainer.policy import load_policy
    from evotrainer.train.grpo import HarnessGRPOTrainer
    from evotrainer.train.loop import build_peft, grpo_args
    from evotrainer.train.recorder import RolloutRecorder, RoundContext

    model, tok = load_policy("embedded")
    model = build_peft(model, session.grpo)
    round_id = session.store.start_round(session.run_id, int(time.time() * 1000) % 10**9, "bench", "base")
    recorder = RolloutRecorder(session.domain, {t.task_id: t for t in tasks}, session.harness, session.store,
                               RoundContext(session.run_id, round_id, "base", session.harness.version, seed),
                               stop_token_ids=[tok.eos_token_id, tok.pad_token_id],
                               audit_groups=session.config.train.audit_groups)  # the audit on, as our loop runs
    timer = StepTimer()
    trainer = HarnessGRPOTrainer(model=model, args=grpo_args(session, steps, seed, workdir),
                                 train_dataset=dataset(session, tasks), processing_class=tok,
                                 recorder=recorder, callbacks=[timer], loss_dtype=loss_dtype,
                                 shrink_batch=fast, decode_weights=fast, shared_prefix=fast)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    recorder.audit.finish()  # every step audited, as train_round does (train/audit.py)
    timer.audited = recorder.audit.audited
    return timer


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps per run (the first is warm-up)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per side")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="train.precision of the third side (default auto, as our loop runs)")
    args = ap.parse_args()
    quiet_libraries()
    from evotrainer.train.loop import open_session
    from evotrainer.train.precision import loss_dtype

    work = Path(tempfile.mkdtemp(prefix="evotrainer-bench-"))
    cfg = load_config(CONFIGS_DIR / "math.yaml", ["run_name=bench"])
    session = open_session(cfg, work)
    per_prompt = cfg.train.prompts_per_step
    tasks = session.train_tasks[: args.steps * per_prompt]
    fast = f"ours-{args.precision}-shrink-dw-sp"
    dtype = loss_dtype(args.precision, "cpu")
    plain, ours, ours_fast = [], [], []
    timers: dict[str, list[StepTimer]] = {"plain": [], "ours": [], fast: []}
    for rep in range(args.repeats):
        timers["plain"].append(run_plain(session, tasks, args.steps, 0, work / "plain"))
        plain += timers["plain"][-1].times[1:]
        timers["ours"].append(run_ours(session, tasks, args.steps, 0, work / "ours"))
        ours += timers["ours"][-1].times[1:]
        timers[fast].append(run_ours(session, tasks, args.steps, 0, work / "ours-fast", dtype, True))
        ours_fast += timers[fast][-1].times[1:]
        print(f"repeat {rep}: plain {statistics.median(plain):.2f} s/step, ours {statistics.median(ours):.2f} s/step, "
              f"{fast} {statistics.median(ours_fast):.2f} s/step", flush=True)
    g = session.grpo
    print(f"batch: {per_prompt} prompts x {g['num_generations']} completions, "
          f"max_completion_length {g['max_completion_length']}, model SmolLM2-135M + LoRA r{g['lora_rank']}")
    print(f"plain TRL GRPOTrainer: median {statistics.median(plain):.3f} s/step over {len(plain)} steps")
    print(f"evotrainer step:       median {statistics.median(ours):.3f} s/step over {len(ours)} steps")
    print(f"evotrainer step, train.precision={args.precision} ({'bf16' if dtype else 'fp32'} loss), shrink_batch, decode_weights, shared_prefix: "
          f"median {statistics.median(ours_fast):.3f} s/step over {len(ours_fast)} steps")
    for side, runs in timers.items():
        lengths = [x for t in runs for x in t.lengths[1:]]
        clipped = [x for t in runs for x in t.clipped[1:]]
        print(f"{side:>18}: median completion length {_median(lengths)} tokens, "
              f"clipped at max length {_median([100 * c for c in clipped])}%")
    audited = {side: sum(getattr(t, "audited", 0) for t in runs) for side, runs in timers.items() if side != "plain"}
    print(f"audit (train.audit_groups={session.config.train.audit_groups}): rollouts replayed and compared: "
          + ", ".join(f"{side} {n}" for side, n in audited.items()))
    ratio = statistics.median(ours) / statistics.median(plain)
    print(f"ratio ours/plain: {ratio:.3f} (target <= 1.10)")
    if ratio < 1:
        print(f"our step is faster: plain/ours {1 / ratio:.3f} (see the completion lengths above: "
              "the harness's stop rule and filters change how much each step generates and trains on)")
    print(f"plain (fp32) / {fast}: {statistics.median(plain) / statistics.median(ours_fast):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
