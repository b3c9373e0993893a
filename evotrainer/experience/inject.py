"""Experience in training prompts: lessons go into a share of the prompts the policy generates
from, and come out of the sequences the loss is computed on.

`inject` runs before TRL generates: it picks `share` of the batch's rollouts (seeded), retrieves
the k lessons most similar to each one's prompt, and puts them in front of the last user message.
Each row also gets an `experience` column (None, or its clean prompt and the lesson ids), which
TRL hands to the reward function: the recorder stores and rewards the clean prompt.

`strip` runs after TRL has generated and scored. It re-tokenises every row's clean prompt with
the trainer's own prompt tokenisation and replaces `prompt_ids`/`prompt_mask`, so the loss scores
each completion conditioned on exactly the prompt a clean rollout would have had. Log-probs TRL
computed on the experience-bearing sequence (`old_per_token_logps`, `ref_per_token_logps`) are
recomputed on the clean one, so no ratio or KL term still conditions on the lessons.

Why re-tokenise rather than mask: prompt tokens never carry loss weight anyway, so masking the
lessons would only matter as context, and an attention-mask hole is not the clean prompt: the
tokens after it keep positions shifted by the block's length, and TRL's padding assumes one
contiguous run of real tokens. Simplifications: text prompts only (no images); a multi-turn
`rollout_func` builds its own prompts, so with one the injector stands aside; with vLLM
importance-sampling correction, the engine-mismatch ratio stays the one TRL measured on the
experience-bearing sequence (both sides of it saw the same lessons).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.experience.pool import ExperiencePool, Lesson

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
_MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids")


def _env() -> Environment:
    return Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                       keep_trailing_newline=True, autoescape=False, trim_blocks=True, lstrip_blocks=True)


def render_block(lessons: Sequence[Lesson]) -> str:
    return _env().get_template("experience.md.j2").render(lessons=lessons)


def prompt_text(prompt: Any) -> str:
    """The text a prompt asks: the last user message of a conversation, or the string itself."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    content = (users or list(prompt))[-1].get("content")
    if not isinstance(content, str):
        raise ValueError("experience: only text prompts are supported")
    return content


def with_block(prompt: Any, block: str) -> Any:
    """A copy of the prompt with `block` in front of its last user message (or of the string)."""
    if isinstance(prompt, str):
        return block + prompt
    messages = [dict(m) for m in prompt]
    at = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
    if not isinstance(messages[at].get("content"), str):
        raise ValueError("experience: only text prompts are supported")
    messages[at]["content"] = block + messages[at]["content"]
    return messages


class ExperienceInjector:
    """Lessons into a share of a training batch's prompts; out of what the loss sees."""

    def __init__(self, pool: ExperiencePool, domain: str, share: float, k: int = 2,
                 min_score: float = -1.0, seed: int = 0) -> None:
        if not 0.0 <= share <= 1.0 or k < 1:
            raise ValueError("experience: share must be in [0, 1] and k >= 1")
        self.pool, self.domain = pool, domain
        self.share, self.k, self.min_score = share, k, min_score
        self._rng = random.Random(seed)
        self._template = _env().get_template("experience.md.j2")
        self._clean: list[Any] | None = None  # the clean prompt of every row of the batch in flight
        self.last_lessons: list[tuple[str, ...]] = []  # lesson ids per row of that batch
        self._warned = False
        self.clip_high: float | None = None  # epsilon_high for guided rows (harness experience.clip_high)

    @classmethod
    def from_harness(cls, harness, pool: ExperiencePool, domain: str, seed: int) -> ExperienceInjector | None:
        """The injector harness.yaml `experience` asks for; None when its share is 0."""
        spec = harness.spec.experience
        if spec["share"] <= 0:
            return None
        injector = cls(pool, domain, spec["share"], spec["k"], spec["min_score"], seed)
        injector.clip_high = spec["clip_high"]
        return injector

    def inject(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Copies of the rows, `share` of them (rounded) with lessons in their prompt."""
        n = len(inputs)
        chosen = sorted(self._rng.sample(range(n), round(self.share * n)))
        if chosen and not self.pool.lessons(self.domain) and not self._warned:
            self._warned = True
            log.warning("experience: share %.2f, but the pool holds no %s lessons; run `evotrainer "
                        "experience distill`", self.share, self.domain)
        queries = {i: prompt_text(inputs[i]["prompt"]) for i in chosen}
        unique = sorted(set(queries.values()))
        found = dict(zip(unique, self.pool.search_many(unique, self.domain, self.k, self.min_score)))
        rows, self.last_lessons = [], []
        for i, row in enumerate(inputs):
            lessons = [hit.lesson for hit in found[queries[i]]] if i in queries else []
            ids = tuple(lesson.id for lesson in lessons)
            row = dict(row)
            if lessons:
                row["experience"] = {"prompt": row["prompt"], "lessons": list(ids)}
                row["prompt"] = with_block(row["prompt"], self._template.render(lessons=lessons))
            else:
                row["experience"] = None
            rows.append(row)
            self.last_lessons.append(ids)
        self._clean = [row["prompt"] for row in inputs]
        return rows

    def strip(self, trainer, output: dict[str, Any]) -> dict[str, Any]:
        """The output with every prompt re-tokenised clean and the log-probs that saw lessons redone."""
        clean, self._clean = self._clean, None
        guided = sum(1 for ids in self.last_lessons if ids)
        trainer._metrics["train"]["experience/guided_share"].append(guided / max(len(self.last_lessons), 1))
        if clean is None or not guided:
            return output
        present = [k for k in _MULTIMODAL_KEYS if k in output]
        if present:
            raise RuntimeError(f"experience: cannot strip lessons from multimodal prompts ({', '.join(present)})")
        import torch
        from trl.trainer.utils import pad

        ids, _, _ = trainer._tokenize_prompts(clean)  # TRL's own path: the ids a clean rollout gets
        device = output["prompt_ids"].device
        rows = [torch.tensor(x) for x in ids]
        output = dict(output)
        output["prompt_ids"] = pad(rows, padding_value=trainer._tokenizer.pad_token_id, padding_side="left",
                                   pad_to_multiple_of=trainer.pad_to_multiple_of).to(device)
        output["prompt_mask"] = pad([torch.ones_like(r, dtype=torch.long) for r in rows], padding_value=0,
                                    padding_side="left", pad_to_multiple_of=trainer.pad_to_multiple_of).to(device)
        _rescore(trainer, output)
        return output


def _rescore(trainer, output: dict[str, Any]) -> None:
    """Recompute, on the clean sequence, the log-probs TRL took on the experience-bearing one."""
    wanted = [k for k in ("old_per_token_logps", "ref_per_token_logps") if k in output]
    if not wanted:
        return
    from contextlib import nullcontext

    import torch
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    keep = output["completion_ids"].size(1)
    batch = trainer.args.per_device_train_batch_size
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        if "old_per_token_logps" in output:
            output["old_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, keep, batch_size=batch)[0]
        if "ref_per_token_logps" in output:
            # As TRL does: a separate reference model, or the PEFT model with its adapter off
            # (or its "ref" adapter, when an existing adapter is being trained further).
            model, context = trainer.ref_model, nullcontext()
            if model is None:
                model = trainer.model
                unwrapped = trainer.accelerator.unwrap_model(trainer.model)
                context = use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
            with context:
                output["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                    model, ids, mask, keep, batch_size=batch)[0]
