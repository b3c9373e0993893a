"""The inner loop: rounds of TRL GRPO + LoRA under a harness, every rollout stored, held-out
evaluated after every round, adapters saved per round, resumable from the store.

Each round builds a fresh GRPOTrainer over the same PEFT model, so the harness's curriculum
re-weights task sampling at round boundaries (the segment is the round). Simplification: the
optimizer state is not carried across rounds; each round starts AdamW afresh.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from evotrainer.api import TaskStats
from evotrainer.config import Config
from evotrainer.console import make_console
from evotrainer.dist import GatheredRollouts, barrier, distributed, is_main, share
from evotrainer.domains import build_domain
from evotrainer.domains.base import Task, prompt_scaffold
from evotrainer.harness.calls import HarnessJob
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessSpec
from evotrainer.harness.repo import HarnessRepo
from evotrainer.harness.spec import trainer_kwargs
from evotrainer.policy import adapter_version, load_policy
from evotrainer.store import Store
from evotrainer.train.evaluate import EvalResult, check_backends, eval_backend_name, evaluate, make_eval_backend
from evotrainer.train.splits import carve_validation
from evotrainer.train.step_stats import step_stats
from evotrainer.workspace import ensure_workspace


@dataclass
class RoundSummary:
    index: int
    heldout_success: float | None  # None: not evaluated on held-out (a live pilot's arm)
    train_reward: float
    train_success: float
    step_time: float
    adapter: str
    metrics: dict = field(default_factory=dict)
    validation_success: float | None = None  # None: the run has no validation split


@dataclass
class Session:
    """Everything a round needs, prepared once per command."""

    config: Config
    workdir: Path
    store: Store
    harness: IsolatedHarness  # its code runs only in a sandbox worker (harness/isolated.py)
    domain: object
    train_tasks: list[Task]
    heldout: dict[int, list[Task]]
    run_id: int
    console: Console
    # carved from the train pool (train/splits.py); one list, answered under every eval seed
    validation: list[Task] = field(default_factory=list)
    eval_heldout: bool = True  # False for a live pilot's arms: the held-out split decides nothing
    eval_backend: object = None  # built on first use; a vLLM engine or a server client lives on
    rollout_cache: object = None  # memory/cache.RolloutCache under <workdir>/cache, on first eval
    stats_run_id: int | None = None  # whose task history the curriculum reads; None: this run's
    stats_before: int | None = None  # with stats_run_id: only its rounds before this index

    @property
    def grpo(self) -> dict:
        return self.harness.spec.grpo


def open_session(config: Config, workdir: Path, console: Console | None = None,
                 harness: IsolatedHarness | None = None) -> Session:
    console = console or make_console(stderr=True)
    check_backends(config)  # a vLLM config on a machine without CUDA fails here, before any work
    d = config.domain
    # A bad domain, task file or option fails here too, before a workspace or a store is made.
    domain = build_domain(d, judge=config.judge)
    pool = domain.tasks("train", d.train_size + d.validation_size, d.seed)
    train_tasks, validation = carve_validation(pool, d.train_size, d.validation_size)
    if d.validation_size and len(validation) < d.validation_size:
        console.print(f"[yellow]the train pool holds {len(pool)} task(s): a validation split of "
                      f"{len(validation)} (domain.validation_size {d.validation_size})"
                      + ("; the held-out split decides instead" if not validation else ""))
    heldout = {s: domain.tasks("heldout", d.heldout_size, s) for s in config.eval.seeds}
    workdir.mkdir(parents=True, exist_ok=True)
    store = Store.open(workdir, config.store.url)
    if harness is None:
        # config.harness is only the seed of a new workspace; training reads a commit.
        if is_main():  # rank 0 creates the workspace; the others find it made (evotrainer/dist.py)
            ensure_workspace(workdir, config.domain.name, seed=config.harness_dir())
        barrier()
        ws = ensure_workspace(workdir, config.domain.name, seed=config.harness_dir())
        harness = HarnessRepo(ws.harnesses).load(config.harness_rev)
    # Training scores with the determinism reruns a backtest makes (harness/calls.py: one protocol).
    harness.job = HarnessJob(config.gate.determinism_sample)
    if d.frontier.per_round:  # the variants earlier rounds synthesized, re-validated
        from evotrainer.frontier.synthesize import frontier_tasks

        known = {t.task_id for t in train_tasks}
        train_tasks += [t for t in frontier_tasks(store, d.name) if t.task_id not in known]
    run_id = None
    if is_main():
        store.upsert_tasks(d.name, [_task_row(t) for t in train_tasks])
        store.upsert_tasks(d.name, [_task_row(t) for ts in heldout.values() for t in ts])
        store.upsert_tasks(d.name, [_task_row(t) for t in validation])
        run_id = store.get_or_create_run(config.run_name, d.name, config.model_dump(mode="json"))
    run_id = share(run_id)
    return Session(config, workdir, store, harness, domain, train_tasks, heldout, run_id, console,
                   validation=validation)


def _task_row(t: Task) -> dict:
    return {"task_id": t.task_id, "split": t.split, "level": t.level, "prompt": t.prompt,
            "answer": t.answer, "meta": dict(t.meta)}


def eval_tasks(session: Session, split: str) -> dict[int, list[Task]]:
    """The tasks each eval seed answers on `split` ("heldout" or "validation"; none when the run
    has no validation split)."""
    if split == "heldout":
        return session.heldout
    if split == "validation":
        return {s: session.validation for s in session.config.eval.seeds} if session.validation else {}
    raise ValueError(f"no eval split {split!r}")


def evaluate_heldout(session: Session, model, tokenizer, round_id: int | None,
                     adapter: str | None, split: str = "heldout") -> list[EvalResult]:
    """Evaluate `adapter` on the held-out split (or, with split="validation", on the validation
    split) under every eval seed, storing one evals row per seed."""
    if session.config.domain.scaffold == "agent":  # multi-turn episodes: train/rollout.py
        from evotrainer.train.rollout import evaluate_heldout_agent

        return evaluate_heldout_agent(session, model, tokenizer, round_id, adapter, split)
    results = []
    max_new = session.config.eval.max_new_tokens or session.grpo["max_completion_length"]
    backend = heldout_backend(session, model, tokenizer)
    backend.use_adapter(adapter)
    for seed, tasks in eval_tasks(session, split).items():
        r = evaluate(model, tokenizer, session.domain, session.harness, tasks, seed=seed,
                     max_new_tokens=max_new, batch_size=session.config.eval.batch_size,
                     backend=backend)
        session.store.add_eval(session.run_id, round_id, split, adapter, seed, r.n, r.successes, r.details())
        results.append(r)
    if hasattr(session.domain, "record_agreement"):  # judged: the judge against people, once per session
        session.domain.record_agreement(session.workdir)
    return results


def heldout_backend(session: Session, model, tokenizer):
    """The eval backend: hf wraps the model in hand; vllm and openai are built once per session.
    With eval.cache, generations go through the rollout cache (memory/cache.py)."""
    if eval_backend_name(session.config) == "hf":
        backend = make_eval_backend(session.config, model, tokenizer)
    else:
        if session.eval_backend is None:
            session.eval_backend = make_eval_backend(session.config,
                                                     lora_rank=session.grpo["lora_rank"])
        backend = session.eval_backend
    if not session.config.eval.cache:
        return backend
    from evotrainer.memory.cache import CachedBackend, RolloutCache

    if session.rollout_cache is None:
        session.rollout_cache = RolloutCache(session.workdir / "cache")
    return CachedBackend(backend, session.rollout_cache, session.config.policy.model)


def sample_round_tasks(session: Session, n: int, seed: int, index: int | None = None) -> list[Task]:
    """Draw the round's prompts with the harness curriculum's weights over per-task history, or,
    with harness.yaml `memory` enabled, over the tasks the run's replay memory holds."""
    if session.harness.spec.memory["enabled"]:
        task_stats = share(memory_task_stats(session, index, seed) if is_main() else None)
    else:
        history = session.stats_run_id or session.run_id
        stats = {s.task_id: s for s in session.store.task_stats(session.config.domain.name, history,
                                                               session.stats_before)}
        task_stats = [
            stats.get(t.task_id) or TaskStats(t.task_id, 0, 0, {"level": t.level})
            for t in session.train_tasks
        ]
    weights = session.harness.weights(task_stats)
    w = [weights.get(t.task_id, 0.0) for t in session.train_tasks]
    if sum(w) <= 0:
        raise RuntimeError("curriculum.py: weights() gave every train task weight 0")
    return random.Random(seed).choices(session.train_tasks, weights=w, k=n)


def run_memory(session: Session, before: int | None = None):
    """The run's replay memory (harness.yaml memory; evotrainer/memory/run.py), having observed
    every finished round (below `before`, when given) it had not seen yet."""
    from evotrainer.memory.run import RunMemory

    memory = RunMemory.open(session.workdir, session.config.run_name, session.harness.spec.memory)
    finished = [r["index"] for r in session.store.rounds(session.run_id) if r["finished_at"]]
    memory.catch_up(session.store, session.run_id, session.config.domain.name,
                    [i for i in finished if before is None or i < before])
    return memory


def memory_task_stats(session: Session, index: int | None, seed: int) -> list[TaskStats]:
    """The replay memory's tasks for round `index`: observe the finished rounds it has not seen,
    forget, admit, and report what it holds."""
    spec = session.harness.spec.memory
    if index is None:
        last = session.store.last_finished_round(session.run_id)
        index = last[0] + 1 if last else 0
    memory = run_memory(session, before=index)
    admitted = memory.refill(session.train_tasks, index, spec["admit"], seed)
    counts = memory.memory.strata_counts()
    session.console.print(f"memory: {len(memory.memory)} task(s) held, {len(admitted)} admitted; "
                          + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    return memory.task_stats(session.train_tasks)


def build_peft(model, grpo: dict):
    from peft import PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        return model
    return get_peft_model(model, lora_config(grpo))


def lora_config(grpo: dict):
    """LoraConfig from harness.yaml's LoRA knobs (harness/spec.py's table) on every linear layer."""
    from peft import LoraConfig

    return LoraConfig(**trainer_kwargs(grpo, "LoraConfig"), target_modules="all-linear", task_type="CAUSAL_LM")


def grpo_args(session: Session, steps: int, seed: int, output_dir: Path):
    return grpo_config(session.harness.spec, session.config, steps, seed, output_dir)


def grpo_config(spec: HarnessSpec, config: Config, steps: int, seed: int, output_dir: Path):
    """GRPOConfig from harness.yaml's GRPO knobs (harness/spec.py's table) and what the config owns."""
    import torch
    from trl import GRPOConfig

    knobs, t = trainer_kwargs(spec.grpo, "GRPOConfig"), config.train
    return GRPOConfig(
        output_dir=str(output_dir), max_steps=steps, seed=seed,
        per_device_train_batch_size=t.prompts_per_step * knobs["num_generations"], gradient_accumulation_steps=1,
        # warmup_ratio arrives as warmup_steps (< 1: a share of the round); "constant" would ignore it
        lr_scheduler_type="constant_with_warmup" if knobs["warmup_steps"] else "constant",
        logging_steps=t.logging_steps, save_strategy="no", report_to=t.report_to or "none",
        use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True,
        gradient_checkpointing=t.gradient_checkpointing, **knobs, **vllm_args(config),
    )


def session_loss_dtype(session: Session):
    """The autocast dtype of the loss's forward pass (train.precision), None for fp32."""
    import torch

    from evotrainer.train.precision import loss_dtype

    return loss_dtype(session.config.train.precision, "cuda" if torch.cuda.is_available() else "cpu")


def vllm_args(config: Config) -> dict:
    """GRPOConfig's vllm_* arguments (TRL 1.16) for policy.backend=vllm; none for hf."""
    if config.policy.backend != "vllm":
        return {}
    v = config.policy.vllm
    args = {"use_vllm": True, "vllm_mode": v.mode, "vllm_enable_sleep_mode": v.enable_sleep_mode,
            "vllm_max_model_length": v.max_model_length}
    if v.mode == "colocate":
        args.update(vllm_gpu_memory_utilization=v.gpu_memory_utilization,
                    vllm_tensor_parallel_size=v.tensor_parallel_size)
    else:  # the server's memory and parallelism are `trl vllm-serve` flags, not trainer arguments
        args.update(vllm_server_base_url=v.server_base_url, vllm_server_host=v.server_host,
                    vllm_server_port=v.server_port, vllm_server_timeout=v.server_timeout,
                    vllm_group_port=v.group_port)
    return args


def step_judge(session: Session):
    """The step judge of config `judge` (endpoint or local model), its labels cached in the store."""
    from evotrainer.judge import JudgeRecords, StepJudge, make_backend

    cfg = session.config.judge
    return StepJudge(make_backend(cfg), records=JudgeRecords(session.store), max_retries=cfg.max_retries,
                     max_tokens=cfg.max_tokens, max_chars=cfg.max_chars)


def train_round(session: Session, model, tokenizer, index: int, steps: int, progress,
                start: str | None = None) -> tuple:
    """One round: train `steps` GRPO steps, save the adapter, evaluate held-out. `start` names
    the adapter the model was loaded from when it is not this run's previous round."""
    from evotrainer.train.progress import ProgressCallback

    seed = session.config.train.seed + index
    round_id, model_version = _begin_round(session, index, start)
    tasks = sample_round_tasks(session, steps * session.config.train.prompts_per_step, seed, index)
    rows, scaffold_kwargs = _round_dataset(session, tasks, tokenizer, seed)
    recorder = _recorder(session, round_id, model_version, seed, tokenizer)
    callback = ProgressCallback(progress, progress.add_task(f"round {index}", total=steps, info=""))
    trainer = _trainer(session, model, tokenizer, rows, steps, seed, callback=callback, recorder=recorder,
                       scaffold_kwargs=scaffold_kwargs)
    started = time.perf_counter()
    trainer.train()
    recorder.audit.finish()  # AuditFailure: the round stops here, its adapter never saved (train/audit.py)
    step_time = (time.perf_counter() - started) / steps
    trained = time.perf_counter()
    out = _adapters(session) / f"round-{index}"
    validation, evals = _save_and_evaluate(session, trainer.model, tokenizer, round_id, out)
    summary = _round_summary(index, evals, validation, callback.history, step_time, out)
    # what the round cost, by part: the steps, then saving the adapter and evaluating it
    summary.metrics["train_seconds"] = trained - started
    summary.metrics["eval_seconds"] = time.perf_counter() - trained
    _finish_round(session, round_id, summary)
    return trainer.model, summary


def _adapters(session: Session) -> Path:
    return session.workdir / "adapters" / session.config.run_name


def _begin_round(session: Session, index: int, start: str | None) -> tuple[int, str]:
    """The round's id (rank 0 writes its row, every rank gets the id) and the version of the
    adapter it trains from: `start`, or else this run's previous round."""
    prev = Path(start) if start else (_adapters(session) / f"round-{index - 1}" if index > 0 else None)
    model_version = adapter_version(prev if prev and prev.is_dir() else None)
    round_id = share(session.store.begin_round(session.run_id, index, session.harness.version, model_version)
                     if is_main() else None)
    return round_id, model_version


def _round_dataset(session: Session, tasks: list[Task], tokenizer, seed: int) -> tuple[list[dict], dict]:
    """The round's dataset rows, and the trainer arguments its scaffold and harness.yaml ask for."""
    from evotrainer.experience import ExperiencePool
    from evotrainer.experience.inject import ExperienceInjector

    cfg = session.config
    prompts = session.harness.render_prompts([t.prompt for t in tasks],  # one request for the round
                                             scaffold=prompt_scaffold(session.domain))
    rows = [{"prompt": [{"role": "user", "content": p}], "task_id": t.task_id} for t, p in zip(tasks, prompts)]
    kwargs: dict = {}
    if cfg.domain.scaffold == "agent":  # multi-turn episodes through TRL's rollout_func: train/rollout.py
        from evotrainer.train.rollout import AgentRollout, agent_rows

        rows = agent_rows(tasks)
        kwargs["rollout_func"] = AgentRollout(
            session.domain, {t.task_id: t for t in session.train_tasks}, session.harness, cfg.domain.agent, tokenizer,
            decode_weights=cfg.train.decode_weights)
    # harness.yaml `experience`: lessons in a share of the prompts (experience/inject.py); none for
    # the agent scaffold, whose rollout_func builds its own prompts
    kwargs["experience"] = (None if cfg.domain.scaffold == "agent" else ExperienceInjector.from_harness(
        session.harness, ExperiencePool(session.store), cfg.domain.name, seed))
    # harness.yaml `step_credit`: a judge labels each step GOOD/BAD during training (judge/steps.py)
    if session.harness.spec.step_credit["enabled"]:
        kwargs["step_labeller"] = step_judge(session)
    return rows, kwargs


def _recorder(session: Session, round_id: int, model_version: str, seed: int, tokenizer):
    """What scores and stores every rollout of the round (all ranks' through rank 0 when distributed)."""
    from evotrainer.train.recorder import RolloutRecorder, RoundContext

    return RolloutRecorder(
        session.domain, {t.task_id: t for t in session.train_tasks}, session.harness,
        GatheredRollouts(session.store) if distributed() else session.store,
        RoundContext(session.run_id, round_id, model_version, session.harness.version, seed),
        stop_token_ids=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        group_size=session.grpo["num_generations"], audit_groups=session.config.train.audit_groups,
    )


def _trainer(session: Session, model, tokenizer, rows: list[dict], steps: int, seed: int, *, callback, recorder,
             scaffold_kwargs: dict):
    """The round's GRPO trainer, reporting to the progress `callback` and storing through `recorder`."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from evotrainer.train.grpo import HarnessGRPOTrainer
    from evotrainer.train.progress import CrashPointCallback

    trainer = HarnessGRPOTrainer(
        model=model, args=grpo_args(session, steps, seed, session.workdir / "trainer"),
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer, recorder=recorder,
        callbacks=[callback, CrashPointCallback(session.config.run_name)], loss_dtype=session_loss_dtype(session),
        shrink_batch=session.config.train.shrink_batch, decode_weights=session.config.train.decode_weights,
        shared_prefix=session.config.train.shared_prefix, **scaffold_kwargs,
    )
    trainer.remove_callback(PrinterCallback)  # our progress bar replaces the raw log dicts
    return trainer


def _save_and_evaluate(session: Session, model, tokenizer, round_id: int,
                       out: Path) -> tuple[list[EvalResult], list[EvalResult]]:
    """One adapter, its (validation, held-out) evals, on rank 0; the other ranks wait for them."""
    evals = None
    if is_main():
        model.save_pretrained(str(out))
        evals = (evaluate_heldout(session, model, tokenizer, round_id, str(out), "validation"),
                 evaluate_heldout(session, model, tokenizer, round_id, str(out)) if session.eval_heldout else [])
    return share(evals)


def _round_summary(index: int, evals: list[EvalResult], validation: list[EvalResult], history: list[dict],
                   step_time: float, adapter: Path) -> RoundSummary:
    summary = RoundSummary(
        index=index,
        heldout_success=statistics.fmean(e.success_rate for e in evals) if evals else None,
        train_reward=statistics.fmean(h["reward"] for h in history) if history else 0.0,
        train_success=statistics.fmean(h.get("verified/success", 0) for h in history) if history else 0.0,
        step_time=step_time,
        adapter=str(adapter),
    )
    summary.metrics = {"heldout_success": summary.heldout_success, "train_reward": summary.train_reward,
                       "train_success": summary.train_success, "step_time": summary.step_time,
                       "heldout_by_seed": {e.seed: e.success_rate for e in evals},
                       "steps": step_stats(history)}  # the optimiser's per-step statistics (TRL's logs)
    if validation:
        summary.validation_success = _pooled(validation)
        summary.metrics["validation_success"] = summary.validation_success
    return summary


def _pooled(evals: list[EvalResult]) -> float:
    n = sum(e.n for e in evals)
    return sum(e.successes for e in evals) / n if n else 0.0


def _finish_round(session: Session, round_id: int, summary: RoundSummary) -> None:
    if is_main():
        session.store.finish_round(round_id, summary.metrics, summary.adapter)
        if session.harness.spec.memory["enabled"]:
            run_memory(session)  # the memory on disk holds this round's results
    barrier()  # the next round reads this one's rollouts and status on every rank


def add_frontier_tasks(session: Session, index: int) -> None:
    """Self-questioning: validated variants of the tasks at the policy's frontier join the train
    split before round `index` (config domain.frontier; evotrainer/frontier)."""
    fc = session.config.domain.frontier
    if not fc.per_round or index == 0:  # round 0 has no pass rates to place tasks by
        return
    from evotrainer.frontier.synthesize import synthesize_frontier

    report = None
    if is_main():
        stats = None  # with harness.yaml memory on, parents are picked by its drift-aware beliefs
        if session.harness.spec.memory["enabled"]:
            stats = run_memory(session).task_stats(session.train_tasks)
        report = synthesize_frontier(session.store, session.config.domain.name, band=tuple(fc.band),
                                     n=fc.per_round, seed=session.config.train.seed + index,
                                     run_id=session.run_id, min_attempts=fc.min_attempts,
                                     known=[t for ts in session.heldout.values() for t in ts] + session.validation,
                                     stats=stats)
    accepted = share(report.accepted if report is not None else None)
    known = {t.task_id for t in session.train_tasks}
    session.train_tasks += [t for t in accepted if t.task_id not in known]
    if report is not None:
        session.console.print(f"frontier: {len(report.accepted)} new task(s) from {len(report.parents)} "
                              f"in-band parent(s), {len(report.rejected)} rejected")


def train_from(session: Session, adapter: str | None, index: int, steps: int | None = None) -> RoundSummary:
    """Round `index` of this session's run, trained from `adapter` (another run's round, or the
    base model when None): verification's control arm (coevolve/control.py)."""
    from evotrainer.train.progress import make_progress

    model, tokenizer = load_policy(session.config.policy.model, adapter, trainable=True)
    model = build_peft(model, session.grpo)
    with make_progress(session.console) as progress:
        _, summary = train_round(session, model, tokenizer, index, steps or session.config.train.steps_per_round,
                                 progress, start=adapter)
    return summary


def run_training(session: Session, rounds: int | None = None, steps: int | None = None,
                 start_adapter: str | None = None) -> dict:
    """Train `rounds` more rounds, resuming after the last finished round of this run, from that
    round's adapter or, when given, from `start_adapter` (a reverted change's control arm)."""
    from evotrainer.train.progress import make_progress

    cfg = session.config
    rounds = rounds or cfg.train.rounds
    steps = steps or cfg.train.steps_per_round
    last = session.store.last_finished_round(session.run_id)
    start = last[0] + 1 if last else 0
    adapter = start_adapter or (last[1] if last else None)
    if last:
        session.console.print(f"[cyan]resuming run {cfg.run_name!r} after round {last[0]} ({adapter})")
    model, tokenizer = load_policy(cfg.policy.model, adapter, trainable=True)
    base = None
    # Rank 0 decides: another rank could read the store after rank 0 has written the base eval.
    need_base = share(is_main() and not any(e["round_id"] is None and e["adapter"] is None
                                            for e in session.store.evals(session.run_id)))
    if need_base:
        validation: list[EvalResult] = []
        if is_main():
            validation = evaluate_heldout(session, model, tokenizer, None, None, "validation")
            base = evaluate_heldout(session, model, tokenizer, None, None)
        base = share(base)
        session.console.print(f"base held-out success: {statistics.fmean(r.success_rate for r in base):.3f}"
                              + (f"  validation {_pooled(validation):.3f}" if validation else ""))
    model = build_peft(model, session.grpo)
    summaries = []
    with make_progress(session.console) as progress:
        for index in range(start, start + rounds):
            add_frontier_tasks(session, index)
            model, summary = train_round(session, model, tokenizer, index, steps, progress,
                                         start=start_adapter if index == start else None)
            summaries.append(summary)
            val = summary.validation_success
            progress.console.print(
                f"round {index}: held-out success {summary.heldout_success:.3f}  "
                + (f"validation {val:.3f}  " if val is not None else "") +
                f"train reward {summary.train_reward:.3f}  step {summary.step_time:.1f}s")
    return {"base": base, "rounds": summaries}
