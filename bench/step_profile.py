"""Where a GRPO step's time goes on this machine, and how far generation is from the hardware.

Trains a few steps of our trainer (the default math config unless `--config`) with timers
around its parts; time is charged to the innermost part running, so nothing is counted twice:

- generation: `generate` (TRL's sampling of the group's completions)
- reward + record: the recorder (trusted check, the harness reward in its sandbox worker)
- scoring forward: log-prob passes outside the loss (old policy / reference model, when TRL needs them)
- loss forward: the policy's forward pass inside the loss
- backward: `accelerator.backward`
- store: `RolloutRecorder.commit` (the batch's rows into the store)
- other: the rest of the step (optimizer step, TRL's bookkeeping, padding, logging)

Each `--variants` entry is profiled in turn in one process, and the first one's step time over
each other's is printed. The variants: `generate` (transformers' generate, every row decoded until
the last ends) or `shrink` (train.shrink_batch: the batch drops the rows that ended), each with
`fp32` or `bf16` (train.precision: the loss's forward pass under bf16 autocast), sampling with
peft's LoRA layers on the weights as they train, and each of those with `-dw`
(train.decode_weights: the adapter merged and the weights laid out for decoding while sampling),
and each of those with `-sp` (train.shared_prefix: the log-prob passes run each distinct prompt
once and score only the completions); without `-sp`, TRL's pass over every whole row.

Generation is compared with the memory-bandwidth bound: a decode step reads every weight once
whatever the batch, so decode steps per second cannot beat bandwidth / weight bytes. Bandwidth
is measured here with a large tensor copy. The first step (warm-up) is dropped.

    python bench/step_profile.py [--steps 4] [--config configs/math.yaml] [--set key=value ...]
                                 [--variants shrink-fp32-dw shrink-fp32-dw-sp ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from transformers import PrinterCallback, TrainerCallback

from evotrainer.cli.main import quiet_libraries
from evotrainer.config import load_config
from evotrainer.paths import CONFIGS_DIR

VARIANTS = {f"{decode}-{precision}{dw}{sp}": [f"train.shrink_batch={str(decode == 'shrink').lower()}",
                                              f"train.precision={precision}",
                                              f"train.decode_weights={str(bool(dw)).lower()}",
                                              f"train.shared_prefix={str(bool(sp)).lower()}"]
            for decode in ("generate", "shrink") for precision in ("fp32", "bf16") for dw in ("", "-dw")
            for sp in ("", "-sp")}


class Profile:
    """Exclusive time per label: a nested call's time is charged to it, not to its caller."""

    def __init__(self):
        self.stack: list[list] = []  # [label, started, child seconds]
        self.seconds: dict[str, float] = defaultdict(float)
        self.decode_steps = 0
        self.decode_seconds = 0.0

    def wrap(self, owner, name: str, label: str, unless_in: str | None = None) -> None:
        """Time `owner.name` as `label`; inside a `unless_in` call it is left to that label."""
        original = getattr(owner, name)
        profile = self

        def timed(*args, **kwargs):
            if unless_in is not None and any(frame[0] == unless_in for frame in profile.stack):
                return original(*args, **kwargs)
            profile.stack.append([label, time.perf_counter(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                lab, started, child = profile.stack.pop()
                total = time.perf_counter() - started
                profile.seconds[lab] += total - child
                if profile.stack:
                    profile.stack[-1][2] += total
        timed.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, timed)

    def wrap_generate(self, owner, name: str = "generate") -> None:
        """Time `owner.name`, a generate method or train/sampler.py's shrinking_generate (the
        input ids are the `input_ids` keyword or the second positional argument of either)."""
        original = getattr(owner, name)
        profile = self

        def generate(*args, **kwargs):
            started = time.perf_counter()
            out = original(*args, **kwargs)
            elapsed = time.perf_counter() - started
            ids = kwargs.get("input_ids", args[1] if len(args) > 1 else None)
            sequences = getattr(out, "sequences", out)
            if ids is not None and hasattr(sequences, "shape"):
                profile.decode_steps += int(sequences.shape[1] - ids.shape[1])
                profile.decode_seconds += elapsed
            profile.seconds["generation"] += elapsed
            if profile.stack:
                profile.stack[-1][2] += elapsed
            return out
        generate.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, generate)


class StepClock(TrainerCallback):
    def __init__(self, profile: Profile):
        self.profile, self.steps, self._t, self._before = profile, [], 0.0, {}

    def on_step_begin(self, args, state, control, **kw):
        self._t, self._before = time.perf_counter(), dict(self.profile.seconds)

    def on_step_end(self, args, state, control, **kw):
        total = time.perf_counter() - self._t
        parts = {k: v - self._before.get(k, 0.0) for k, v in self.profile.seconds.items()}
        parts["other"] = total - sum(parts.values())
        self.steps.append((total, parts))


def memory_bandwidth(mb: int = 512, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (one read and one write of each byte)."""
    import torch

    src = torch.empty(mb * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return 2 * src.numel() * 4 / best


def profile_steps(cfg, steps: int, work: Path) -> tuple[list, Profile, int]:
    """Train `steps` steps of `cfg` with the timers on; each step's (seconds, parts), the profile
    and the model's weight bytes."""
    from datasets import Dataset
    from transformers.generation.utils import GenerationMixin

    from evotrainer.policy import load_policy
    from evotrainer.train import sampler
    from evotrainer.train.grpo import HarnessGRPOTrainer
    from evotrainer.train.loop import _round_dataset, build_peft, grpo_args, open_session, session_loss_dtype
    from evotrainer.train.recorder import RolloutRecorder, RoundContext

    session = open_session(cfg, work)
    tasks = session.train_tasks[: steps * cfg.train.prompts_per_step]
    model, tok = load_policy(cfg.policy.model)
    model = build_peft(model, session.grpo)
    round_id = session.store.start_round(session.run_id, 0, session.harness.version, "base")
    recorder = RolloutRecorder(session.domain, {t.task_id: t for t in tasks}, session.harness, session.store,
                               RoundContext(session.run_id, round_id, "base", session.harness.version, 0),
                               stop_token_ids=[tok.eos_token_id, tok.pad_token_id])
    rows, scaffold_kwargs = _round_dataset(session, tasks, tok, 0)
    profile = Profile()
    clock = StepClock(profile)
    trainer = HarnessGRPOTrainer(model=model, args=grpo_args(session, steps, 0, work / "trainer"),
                                 train_dataset=Dataset.from_list(rows), processing_class=tok, recorder=recorder,
                                 callbacks=[clock], loss_dtype=session_loss_dtype(session),
                                 shrink_batch=cfg.train.shrink_batch, decode_weights=cfg.train.decode_weights,
                                 shared_prefix=cfg.train.shared_prefix,
                                 **scaffold_kwargs)
    trainer.remove_callback(PrinterCallback)
    profile.wrap_generate(GenerationMixin)
    profile.wrap_generate(sampler, "shrinking_generate")
    profile.wrap(RolloutRecorder, "__call__", "reward + record")
    profile.wrap(RolloutRecorder, "commit", "store")
    profile.wrap(trainer, "_compute_loss", "loss forward")
    profile.wrap(trainer, "_get_per_token_logps_and_entropies", "scoring forward", unless_in="loss forward")
    profile.wrap(trainer.accelerator, "backward", "backward")
    try:
        trainer.train()
    finally:  # the class-level wraps would time the next run twice
        GenerationMixin.generate = GenerationMixin.generate.__wrapped__
        sampler.shrinking_generate = sampler.shrinking_generate.__wrapped__
        for name in ("__call__", "commit"):
            setattr(RolloutRecorder, name, getattr(RolloutRecorder, name).__wrapped__)
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    return clock.steps[1:], profile, weights


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps to train (the first is warm-up)")
    ap.add_argument("--config", type=Path, default=CONFIGS_DIR / "math.yaml")
    ap.add_argument("--set", action="append", default=[], help="a config override (key=value)")
    ap.add_argument("--variants", nargs="+",
                    default=["shrink-fp32-dw", "shrink-fp32-dw-sp"],
                    choices=list(VARIANTS), help="the runs, side by side; the first is the baseline")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is dropped as warm-up)")
    quiet_libraries()
    means: dict[str, float] = {}
    bandwidth = memory_bandwidth()
    for variant in args.variants:
        work = Path(tempfile.mkdtemp(prefix="evotrainer-profile-"))
        cfg = load_config(args.config, ["run_name=profile", *args.set, *VARIANTS[variant]])
        steps, profile, weights = profile_steps(cfg, args.steps, work)
        total = means[variant] = statistics.fmean(t for t, _ in steps)
        print(f"{cfg.domain.name}, {variant} ({' '.join(VARIANTS[variant])}): {cfg.train.prompts_per_step} prompts "
              f"per step, {len(steps)} steps after warm-up")
        print(f"mean step {total:.2f} s")
        labels = sorted({k for _, parts in steps for k in parts}, key=lambda k: -sum(p.get(k, 0) for _, p in steps))
        for label in labels:
            sec = statistics.fmean(p.get(label, 0.0) for _, p in steps)
            print(f"  {label:<16} {sec:8.3f} s  {100 * sec / total:5.1f}%")
        bound = bandwidth / weights
        if profile.decode_seconds:
            rate = profile.decode_steps / profile.decode_seconds
            print(f"generation: {profile.decode_steps} decode steps in {profile.decode_seconds:.1f} s = "
                  f"{rate:.1f} steps/s (all steps, warm-up included)")
            print(f"memory-bandwidth bound: {bandwidth / 1e9:.1f} GB/s copy bandwidth / {weights / 1e6:.0f} MB of "
                  f"weights = {bound:.0f} decode steps/s; measured / bound = {rate / bound:.3f}")
    first = args.variants[0]
    for variant, total in means.items():
        if variant != first:
            print(f"step time {first} / {variant}: {means[first] / total:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
