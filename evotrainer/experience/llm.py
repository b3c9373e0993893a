"""The `llm` distiller: a chat model behind any OpenAI-compatible endpoint writes the lessons.

Groups with failures are sent in batches (groups with a successful sibling first: contrast is
what a lesson is made of), rendered by `templates/distill.md.j2`. The reply must be one JSON
object {"lessons": [{"text", "kind"}]}; a reply that is not is sent back with its problems
(`templates/distill_retry.md.j2`) up to `max_retries` times, then the batch is skipped, and the
reason is logged and kept in `last_errors`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.api import OUTCOME_KINDS
from evotrainer.chat import EndpointError, ReplyError, llm_endpoint, openai_client, reply_json
from evotrainer.experience.distill import MAX_LESSON_CHARS, LessonDraft, register_distiller
from evotrainer.store import StoredRollout

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
_MIN_CHARS = 8
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def parse_lessons(text: str, max_lessons: int, max_chars: int = MAX_LESSON_CHARS) -> list[dict[str, str]]:
    """The lessons of a reply (bare JSON or JSON in a ```json fence); ReplyError says what is wrong."""
    text = (text or "").strip()
    if not text:
        raise ReplyError("the reply is empty")
    data, problem = reply_json(text)
    if problem is not None:
        raise ReplyError("the reply is not JSON")
    if not isinstance(data, dict) or not isinstance(data.get("lessons"), list):
        raise ReplyError('the reply must be a JSON object with a "lessons" list')
    items = data["lessons"]
    if len(items) > max_lessons:
        raise ReplyError(f"{len(items)} lessons; send at most {max_lessons}")
    lessons, errors = [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            errors.append(f"lessons[{i}] must be an object with a string \"text\"")
            continue
        body = " ".join(item["text"].split())
        kind = item.get("kind", "general")
        if not _MIN_CHARS <= len(body) <= max_chars:
            errors.append(f"lessons[{i}].text has {len(body)} characters; write {_MIN_CHARS} to {max_chars}")
        elif not isinstance(kind, str) or not _KIND.match(kind.strip().lower()):
            errors.append(f"lessons[{i}].kind must be an outcome kind or \"general\", got {kind!r}")
        else:
            lessons.append({"text": body, "kind": kind.strip().lower()})
    if errors:
        raise ReplyError("; ".join(errors))
    return lessons


@register_distiller("llm")
class LLMDistiller:
    """Lessons from a chat model behind an OpenAI-compatible `/v1/chat/completions` endpoint."""

    name = "llm"

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, max_retries: int = 2, temperature: float = 0.3,
                 timeout_s: float = 120.0, groups_per_call: int = 4, max_calls: int = 8,
                 max_lessons: int = 3, samples_per_group: int = 3, max_chars: int = 800,
                 max_tokens: int | None = None) -> None:
        """Options not given come from the environment, as for the `llm` outer agent:
        EVOTRAINER_LLM_BASE_URL (else OPENAI_BASE_URL), EVOTRAINER_LLM_MODEL, and the key from
        `api_key`, `api_key_env`, EVOTRAINER_LLM_API_KEY or OPENAI_API_KEY (a local endpoint may
        need none)."""
        self.base_url, self.model, key = llm_endpoint(base_url, model, api_key, api_key_env)
        self.client = openai_client(
            "llm distiller", self.base_url, self.model, key, timeout_s,
            model_hint="pass --model or set EVOTRAINER_LLM_MODEL",
            key_hint="set EVOTRAINER_LLM_API_KEY or OPENAI_API_KEY, or a base URL for a local endpoint")
        if max_retries < 0 or groups_per_call < 1 or max_calls < 1 or max_lessons < 1:
            raise ValueError("llm distiller: max_retries >= 0; groups_per_call, max_calls, max_lessons >= 1")
        self.max_retries, self.temperature, self.max_tokens = max_retries, temperature, max_tokens
        self.groups_per_call, self.max_calls, self.max_lessons = groups_per_call, max_calls, max_lessons
        self.samples_per_group, self.max_chars = samples_per_group, max_chars
        self.templates = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                                     keep_trailing_newline=True, autoescape=False,
                                     trim_blocks=True, lstrip_blocks=True)
        self.last_errors: list[str] = []
        self.on_batch = None  # optional callback(done, total), for a progress bar

    def batches(self, groups: Sequence[Sequence[StoredRollout]]) -> list[list[Sequence[StoredRollout]]]:
        """Groups with a failure, contrasted ones first, cut into at most max_calls batches."""
        failing = [g for g in groups if any(not sr.rollout.outcome.success for sr in g)]
        failing.sort(key=lambda g: not any(sr.rollout.outcome.success for sr in g))  # stable
        size = self.groups_per_call
        return [failing[i:i + size] for i in range(0, len(failing), size)][: self.max_calls]

    def distill(self, domain: str, groups: Sequence[Sequence[StoredRollout]]) -> list[LessonDraft]:
        self.last_errors = []
        drafts: dict[str, LessonDraft] = {}
        batches = self.batches(groups)
        for n, batch in enumerate(batches, 1):
            failed = [sr.rollout.id for g in batch for sr in g if not sr.rollout.outcome.success]
            for lesson in self._ask(domain, batch, n):
                draft = LessonDraft(domain=domain, text=lesson["text"], source=self.name, kind=lesson["kind"],
                                    support=len(failed), evidence=tuple(failed),
                                    meta={"model": self.model, "groups": len(batch)})
                drafts.setdefault(draft.id, draft)
            if self.on_batch is not None:
                self.on_batch(n, len(batches))
        return list(drafts.values())

    def _ask(self, domain: str, batch: Sequence[Sequence[StoredRollout]], n: int) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": self.render_prompt(domain, batch)}]
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            text, finish = self._complete(messages)
            try:
                return parse_lessons(text, self.max_lessons)
            except ReplyError as exc:
                problem = str(exc) + ("; the reply was cut off at the token limit" if finish == "length" else "")
            self.last_errors.append(f"batch {n}, attempt {attempt}: {problem}")
            if attempt == attempts:
                reason = f"batch {n} skipped after {attempts} attempts: {problem}"
                self.last_errors.append(reason)
                log.warning("llm distiller: %s", reason)
                return []
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": self.templates.get_template("distill_retry.md.j2").render(
                             errors=[problem], max_lessons=self.max_lessons, max_chars=MAX_LESSON_CHARS)}]
        return []

    def _complete(self, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        import openai

        extra = {"max_tokens": self.max_tokens} if self.max_tokens else {}
        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, **extra)
        except openai.OpenAIError as exc:
            raise EndpointError(f"llm distiller: chat completion at {self.base_url or 'the OpenAI API'} "
                                f"failed: {exc}") from exc
        if not response.choices:
            return "", None
        choice = response.choices[0]
        return choice.message.content or "", choice.finish_reason

    def render_prompt(self, domain: str, batch: Sequence[Sequence[StoredRollout]]) -> str:
        views = []
        for group in batch:
            rollouts = [sr.rollout for sr in group]
            failures = [r for r in rollouts if not r.outcome.success]
            successes = [r for r in rollouts if r.outcome.success]
            shown = failures[: max(1, self.samples_per_group - 1)] + successes[:1]
            views.append({
                "task_id": rollouts[0].task_id, "size": len(rollouts), "successes": len(successes),
                "prompt": _clip(rollouts[0].prompt, self.max_chars),
                "samples": [{"success": r.outcome.success, "kind": r.outcome.kind, "flags": list(r.outcome.flags),
                             "truncated": r.truncated, "completion": _clip(r.completion, self.max_chars)}
                            for r in shown],
            })
        return self.templates.get_template("distill.md.j2").render(
            domain=domain, groups=views, max_lessons=self.max_lessons, max_chars=MAX_LESSON_CHARS,
            kinds=[k for k in OUTCOME_KINDS if k != "ok"])


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head):]}"


__all__ = ["LLMDistiller", "parse_lessons"]
