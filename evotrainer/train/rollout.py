"""The `agent` scaffold in GRPO training: TRL's `rollout_func` runs one multi-turn episode per
sampled completion and returns the token trace with an env mask, so only the model's tokens train.

TRL 1.16 hands `rollout_func(prompts, trainer)` the batch's prompts (already repeated
`num_generations` times) and expects `prompt_ids`, `completion_ids` and `logprobs` back; any other
key goes to the reward functions, except `env_mask`, which TRL multiplies into the loss mask (1 =
a model token, 0 = text the environment wrote). One episode's completion is every reply's sampled
ids, with the chat-template text between replies (the end of the reply, the tool output, the next
assistant header) spliced in at mask 0. Later replies are generated from that exact trace, so the
ids the loss sees are the ids that were sampled.

Two ways to run a step's episodes (`domain.agent.batched`):

- batched (the default): every episode runs `run_agent` in its own thread and the episodes advance
  turn by turn together: one left-padded `generate` for all episodes still running, while their
  tool calls and test runs overlap (train/batcher.py). Each episode keeps its KV cache across
  turns, so a turn prefills only the text since its last reply. Greedy replies match the sequential path's up to the floating-point
  differences padding brings; sampling draws the whole batch from one RNG stream, so sampled
  trajectories differ from the sequential path's for the same seed. An episode's `time_limit_s`
  includes its waits for the batch.
- sequential: one episode after another, batch-1 generation that keeps each episode's KV cache
  across turns (`TracePolicy`).

Simplifications: `logprobs` is None (no importance-sampling correction, as on TRL's transformers
path); the transformers backend only (policy.backend=vllm is refused for this scaffold).
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evotrainer.api import Rollout
from evotrainer.domains.base import Task
from evotrainer.scaffold.agent import EXIT_STATUSES, ContextLimit, run_agent, to_rollout
from evotrainer.train.batcher import Batcher, cache_kwarg
from evotrainer.train.decode_weights import decoding_weights
from evotrainer.train.evaluate import EvalResult

_MARK = "\u2063evotrainer-reply\u2063"  # stands in for a reply when rendering the text between replies


class TracePolicy:
    """A `run_agent` policy over a transformers causal LM that keeps the episode's token trace:
    `prompt_ids` (the first rendered turn), `completion_ids` (everything after) and `env_mask`
    (1 for sampled ids). `generation_config` None decodes greedily (held-out eval)."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int, max_context_tokens: int,
                 eos_ids: Sequence[int], generation_config=None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.max_context_tokens = max_new_tokens, max_context_tokens
        self.eos_ids = set(eos_ids)
        self.generation_config = generation_config
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []
        self.env_mask: list[int] = []
        self._seen = 0  # messages already in the trace
        self._cache = None  # the KV cache of the trace so far: a later turn only prefills the new text
        self._last_end = ""  # the text of the last reply's final token when it was an end token

    def _render(self, messages: Sequence[Mapping[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str) -> list[int]:
        # The rendered text already holds any special tokens the template wants.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _between(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The template text after the last reply: its closing, the new messages, the next header."""
        reply = {"role": "assistant", "content": _MARK}
        text = self._render([*messages[:self._seen], reply, *messages[self._seen + 1:]])
        if _MARK not in text:
            raise RuntimeError("the chat template dropped an assistant reply; the agent scaffold needs it")
        tail = text.split(_MARK, 1)[1]
        if self._last_end and tail.startswith(self._last_end):
            tail = tail[len(self._last_end):]  # the sampled end token already closed the reply
        return tail

    def __call__(self, messages: list[dict[str, str]]) -> str:
        ids, max_new = self._extend(messages)
        return self._take(self._generate(ids, max_new), messages)

    def _extend(self, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], int]:
        """Add the text since the last reply to the trace; the ids to reply to and the room left."""
        if self.prompt_ids is None:
            self.prompt_ids = self._encode(self._render(messages))
        else:
            env = self._encode(self._between(messages))
            self.completion_ids += env
            self.env_mask += [0] * len(env)
        room = self.max_context_tokens - len(self.prompt_ids) - len(self.completion_ids)
        if room <= 0:
            raise ContextLimit(f"{self.max_context_tokens} tokens used")
        return self.prompt_ids + self.completion_ids, min(self.max_new_tokens, room)

    def _generate(self, ids: list[int], max_new: int) -> list[int]:
        """Batch-1 generation that keeps the KV cache of the trace for the next turn."""
        import torch

        tensor = torch.tensor([ids], device=self.model.device)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new, "return_dict_in_generate": True,
                                  cache_kwarg(): self._cache}
        if self.generation_config is None:
            kwargs.update(do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        else:
            kwargs["generation_config"] = self.generation_config
        with torch.no_grad():
            out = self.model.generate(input_ids=tensor, attention_mask=torch.ones_like(tensor), **kwargs)
        # transformers 5 names it `cache` (`past_key_values` remains as a deprecated alias, 4.x only has it)
        self._cache = out.cache if "cache" in out else out.past_key_values
        return out.sequences[0, len(ids):].tolist()

    def _take(self, new: list[int], messages: Sequence[Mapping[str, str]]) -> str:
        """Add the reply's sampled ids to the trace; the reply's text."""
        end = next((i + 1 for i, t in enumerate(new) if t in self.eos_ids), len(new))
        new = new[:end]  # nothing after the first end token is the model's reply
        self.completion_ids += new
        self.env_mask += [1] * len(new)
        self._last_end = self.tokenizer.decode(new[-1:]) if new and new[-1] in self.eos_ids else ""
        self._seen = len(messages)
        return self.tokenizer.decode(new, skip_special_tokens=True)

    @property
    def num_tokens(self) -> int:
        return sum(self.env_mask)


class BatchedPolicy(TracePolicy):
    """A TracePolicy whose replies come from the step's shared Batcher, which hands back the
    episode's KV cache with each reply.
    `tokenizer_lock` is shared by the step's episodes: a fast tokenizer called from two threads at
    once can fail ("Already borrowed": each call resets its truncation and padding state)."""

    def __init__(self, batcher: Batcher, tokenizer, tokenizer_lock: threading.Lock, **kwargs: Any) -> None:
        super().__init__(batcher.model, tokenizer, **kwargs)
        self.batcher, self.tokenizer_lock = batcher, tokenizer_lock
        self.batch_sizes: list[int] = []  # the size of the batch each reply came from

    def __call__(self, messages: list[dict[str, str]]) -> str:
        with self.tokenizer_lock:
            ids, max_new = self._extend(messages)
        new = self._generate(ids, max_new)
        with self.tokenizer_lock:
            return self._take(new, messages)

    def _generate(self, ids: list[int], max_new: int) -> list[int]:
        new, self._cache = self.batcher.generate(ids, max_new, self.batch_sizes, self._cache)
        return new


@dataclass
class Episode:
    """One finished episode as TRL and the recorder see it (`meta`: the batched path's
    `batch_sizes`, the size of the batch each reply came from)."""

    rollout: Rollout
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    meta: dict[str, Any] = field(default_factory=dict)


def run_episode(domain, task: Task, policy: TracePolicy, limits, stop=None) -> Episode:
    """One agent episode on `task` (a swe domain Task) with the config's limits; never raises for
    anything the policy does."""
    swe = domain.swe_task(task)
    result = run_agent(swe, policy, max_steps=limits.max_turns, time_limit_s=limits.time_limit_s,
                       max_format_errors=limits.max_format_errors, stop=stop,
                       test_timeout_s=limits.test_timeout_s, grade_timeout_s=domain.grade_timeout_s,
                       max_output=limits.max_observation_chars)
    completion, mask = list(policy.completion_ids), list(policy.env_mask)
    if not completion:  # no reply at all (an episode out of time before its first turn)
        completion, mask = [policy.tokenizer.eos_token_id], [0]
    rollout = to_rollout(swe, result, num_tokens=policy.num_tokens, meta={"split": task.split})
    return Episode(rollout, list(policy.prompt_ids or []), completion, mask)


def agent_rows(tasks: Sequence[Task]) -> list[dict]:
    """The GRPO dataset rows: the episode builds its own prompt, the row names the task."""
    return [{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.task_id} for t in tasks]


def run_episodes(model, tokenizer, domain, tasks: Sequence[Task], limits, *, eos_ids: Sequence[int],
                 generation_config=None, stop=None, decode_weights: bool = True,
                 cache: dict | None = None) -> list[Episode]:
    """One episode per task (in order), batched or one after another as `limits.batched` says.
    `generation_config` None decodes greedily. The caller holds the model in its generation state;
    `decode_weights`: with generation's own view of the weights (train/decode_weights.py), kept
    in `cache` by a caller whose base weights do not change."""
    with decoding_weights(model, decode_weights, cache):
        return _run_episodes(model, tokenizer, domain, tasks, limits, eos_ids=eos_ids,
                             generation_config=generation_config, stop=stop)


def _run_episodes(model, tokenizer, domain, tasks: Sequence[Task], limits, *, eos_ids: Sequence[int],
                  generation_config, stop) -> list[Episode]:
    settings = {"max_new_tokens": limits.max_new_tokens, "max_context_tokens": limits.max_context_tokens,
                "eos_ids": eos_ids, "generation_config": generation_config}
    if not limits.batched:
        return [run_episode(domain, task, TracePolicy(model, tokenizer, **settings), limits, stop=stop)
                for task in tasks]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batcher = Batcher(model, pad_token_id=pad, generation_config=generation_config)
    tokenizer_lock = threading.Lock()
    if stop is not None:  # in the batcher's thread: the harness starts its sandbox worker on the first call
        stop = functools.partial(batcher.call, stop)

    def job(task: Task) -> Callable[[], Episode]:
        def episode() -> Episode:
            policy = BatchedPolicy(batcher, tokenizer, tokenizer_lock, **settings)
            done = run_episode(domain, task, policy, limits, stop=stop)
            done.meta["batch_sizes"] = policy.batch_sizes
            return done
        return episode

    return batcher.run([job(task) for task in tasks])


class AgentRollout:
    """TRL's `rollout_func` for the agent scaffold. Reads the batch's task ids from
    `trainer.batch_inputs` (set by HarnessGRPOTrainer before generation); returns the traces, the
    env mask and, for the recorder, each episode's Rollout (`agent_rollout`)."""

    def __init__(self, domain, tasks: Mapping[str, Task], harness, limits, tokenizer,
                 decode_weights: bool = True) -> None:
        self.domain, self.tasks, self.harness = domain, tasks, harness
        self.limits, self.tokenizer, self.decode_weights = limits, tokenizer, decode_weights
        self.weights_cache: dict = {}  # the frozen base weights' decoding copies, for the round
        self.last_batch: list[Episode] = []

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        import torch
        from trl.models import unwrap_model_for_generation

        if trainer.use_vllm:
            raise RuntimeError("the agent scaffold generates with transformers; use policy.backend=hf")
        rows = getattr(trainer, "batch_inputs", None)
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError("AgentRollout needs the batch's rows in trainer.batch_inputs (HarnessGRPOTrainer)")
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         generation_kwargs=trainer.generation_kwargs,
                                         gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                         ) as model, torch.no_grad():
            episodes = run_episodes(model, self.tokenizer, self.domain, [self.tasks[r["task_id"]] for r in rows],
                                    self.limits, eos_ids=trainer.eos_token_ids,
                                    generation_config=trainer.generation_config, stop=self.harness.stop,
                                    decode_weights=self.decode_weights, cache=self.weights_cache)
        self.last_batch = episodes
        mode = "train" if trainer.model.training else "eval"
        counts = Counter(e.rollout.meta["exit_status"] for e in episodes)
        for status in EXIT_STATUSES:  # the terminal states, counted per batch in TRL's logs
            trainer._metrics[mode][f"agent/{status}"].append(counts[status] / len(episodes))
        trainer._metrics[mode]["agent/turns"].append(sum(e.rollout.meta["steps"] for e in episodes) / len(episodes))
        return {"prompt_ids": [e.prompt_ids for e in episodes],
                "completion_ids": [e.completion_ids for e in episodes],
                "logprobs": None,
                "env_mask": [e.env_mask for e in episodes],
                "agent_rollout": [e.rollout for e in episodes]}


def evaluate_agent(model, tokenizer, domain, tasks: Sequence[Task], limits, *, seed: int,
                   decode_weights: bool = True) -> EvalResult:
    """Held-out evaluation of the agent scaffold: one greedy episode per task (one batch over the
    tasks when `limits.batched`), the trusted outcome."""
    import torch

    torch.manual_seed(seed)
    result = EvalResult(seed=seed, n=len(tasks), successes=0)
    was_training = model.training
    model.eval()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = getattr(base, "is_gradient_checkpointing", False)
    if checkpointing:  # it turns the KV cache off: every new token would recompute the prefix
        base.gradient_checkpointing_disable()
    try:
        episodes = run_episodes(model, tokenizer, domain, tasks, limits, eos_ids=[tokenizer.eos_token_id],
                                decode_weights=decode_weights)
        for task, episode in zip(tasks, episodes):
            outcome = episode.rollout.outcome
            result.successes += int(outcome.success)
            result.kinds[outcome.kind] += 1
            if outcome.success:
                result.solved.append(task.task_id)
    finally:
        model.train(was_training)
        if checkpointing:
            base.gradient_checkpointing_enable()
    return result


def evaluate_heldout_agent(session, model, tokenizer, round_id: int | None, adapter: str | None,
                           split: str = "heldout") -> list[EvalResult]:
    """train/loop.py's held-out (or validation) evaluation for domain.scaffold=agent: every seed's
    tasks, stored."""
    from evotrainer.train.loop import eval_tasks

    results = []
    limits = session.config.domain.agent
    for seed, tasks in eval_tasks(session, split).items():
        r = evaluate_agent(model, tokenizer, session.domain, tasks, limits, seed=seed,
                           decode_weights=session.config.train.decode_weights)
        session.store.add_eval(session.run_id, round_id, split, adapter, seed, r.n, r.successes,
                               {"kinds": dict(r.kinds), "scaffold": "agent", "solved": r.solved})
        results.append(r)
    return results


__all__ = ["AgentRollout", "BatchedPolicy", "Episode", "TracePolicy", "agent_rows", "evaluate_agent",
           "evaluate_heldout_agent", "run_episode", "run_episodes"]
