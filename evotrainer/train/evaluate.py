"""Held-out evaluation: greedy decoding, fixed seeds, the trusted check, nothing from the harness
but the prompt template (its PROMPT text, rendered by the trusted prompt worker from the task's
question alone: harness/prompts.py) and the completion length. The generation backend (hf, vllm, openai)
only produces text; success is always computed here by the domain's trusted check."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evotrainer.api import JUDGE_VERIFIED
from evotrainer.domains.base import Domain, Task, prompt_scaffold
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import Harness
from evotrainer.harness.prompts import render_prompts
from evotrainer.policy.backends import GenerationBackend, get_backend, require_vllm

# Re-exported: the hf helpers used to live here.
from evotrainer.policy.hf_backend import HFBackend, chat_prompt, generate_greedy  # noqa: F401


@dataclass
class EvalResult:
    seed: int
    n: int
    successes: int
    kinds: Counter = field(default_factory=Counter)
    solved: list[str] = field(default_factory=list)  # task ids solved, for paired comparisons
    # outcomes whose success is a judge panel's verdict (api.JUDGE_VERIFIED), and their successes
    judge_verified: int = 0
    judge_successes: int = 0

    def details(self) -> dict:
        """The eval row's details; judge-verified counts only when there are any."""
        out: dict = {"kinds": dict(self.kinds), "solved": self.solved}
        if self.judge_verified:
            out["judge_verified"] = {"n": self.judge_verified, "successes": self.judge_successes}
        return out

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0


def eval_backend_name(config) -> str:
    """`auto` follows the policy: a vLLM-trained policy is evaluated with vLLM too."""
    name = config.eval.backend
    if name == "auto":
        return "vllm" if config.policy.backend == "vllm" else "hf"
    return name


def check_backends(config) -> None:
    """Fail before any work when the configured backends cannot run on this machine."""
    if config.policy.backend == "vllm":
        require_vllm("policy.backend=vllm")
    if eval_backend_name(config) == "vllm":
        require_vllm("eval.backend=vllm")


def make_eval_backend(config, model=None, tokenizer=None, lora_rank: int = 16) -> GenerationBackend:
    """Build the configured eval backend. `hf` wraps the given model; the others are built once
    per session and switch adapters per round."""
    name = eval_backend_name(config)
    if name == "hf":
        return get_backend("hf", model=model, tokenizer=tokenizer, batch_size=config.eval.batch_size,
                           decode_weights=config.train.decode_weights)
    if name == "vllm":
        from evotrainer.policy import resolve_model

        return get_backend("vllm", model_path=resolve_model(config.policy.model), lora_rank=lora_rank,
                           gpu_memory_utilization=config.eval.vllm_gpu_memory_utilization,
                           seed=config.train.seed)
    s = config.eval.server
    return get_backend("openai", base_url=s.base_url, model=s.model, api_key=os.environ.get(s.api_key_env),
                       load_adapter=s.load_adapter, concurrency=s.concurrency, timeout_s=s.timeout_s)


def evaluate(model, tokenizer, domain: Domain, harness: IsolatedHarness | Harness, tasks: Sequence[Task], *,
             seed: int, max_new_tokens: int, batch_size: int,
             on_batch: Callable[[int], None] | None = None,
             backend: GenerationBackend | None = None) -> EvalResult:
    """Score `tasks` greedily. Without a backend, generate with `model` through transformers."""
    import torch

    torch.manual_seed(seed)
    backend = backend or HFBackend(model, tokenizer, batch_size)
    # the template as text, rendered where no harness code runs; never the answer as an input
    prompts = render_prompts(harness.prompt_source, [t.prompt for t in tasks], prompt_scaffold(domain))
    result = EvalResult(seed=seed, n=len(tasks), successes=0)
    generations = backend.generate(prompts, max_new_tokens, on_batch)
    if len(generations) != len(tasks):
        raise RuntimeError(f"{backend.name} backend returned {len(generations)} completions "
                           f"for {len(tasks)} prompts")
    for task, (text, truncated, _) in zip(tasks, generations):
        outcome = domain.check(task, text, truncated)
        result.successes += int(outcome.success)
        result.kinds[outcome.kind] += 1
        if JUDGE_VERIFIED in outcome.flags:
            result.judge_verified += 1
            result.judge_successes += int(outcome.success)
        if outcome.success:
            result.solved.append(task.task_id)
    return result
