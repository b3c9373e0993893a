"""One judge role: render the Jinja prompt, ask the backend, validate, retry malformed replies, cache.

A reply that is still malformed after `max_retries` retries is recorded as MISSING (status
"missing", no verdict): it never counts as a pass, and it is asked again on the next call.
Verdicts are cached in the store by (judge model, prompt hash, rollout id); the hash covers the
rendered messages and the sampling settings, so a changed template or role re-asks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateNotFound

from evotrainer.api import Rollout
from evotrainer.config import JudgeConfig, JudgeRoleConfig
from evotrainer.judge.backends import JudgeBackend
from evotrainer.judge.records import JudgeRecords, StoredVerdict
from evotrainer.judge.verdict import Verdict, VerdictError, parse_verdict

TEMPLATES = Path(__file__).parent / "templates"
templates = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                        keep_trailing_newline=False, trim_blocks=True, lstrip_blocks=True, autoescape=False)


@dataclass(frozen=True)
class JudgeResult:
    """What one role said about one rollout. `verdict` is None exactly when status is "missing"."""

    rollout_id: str
    role: str
    model: str
    prompt_hash: str
    status: str  # "ok" | "missing"
    verdict: Verdict | None
    error: str | None
    attempts: int
    cached: bool = False

    def vote(self) -> dict[str, Any]:
        """The compact form kept in rollout meta and the review queue."""
        if self.verdict is None:
            return {"status": self.status, "error": self.error}
        return {"status": self.status, **self.verdict.model_dump()}


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-(limit - head):]}"


def prompt_hash(messages: Sequence[dict[str, str]], **settings: Any) -> str:
    payload = json.dumps({"messages": list(messages), "settings": settings}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def ask(backend: JudgeBackend, messages: list[dict[str, str]], parse: Callable[[str], Any], *,
        temperature: float, max_tokens: int, max_retries: int) -> tuple[Any | None, str | None, int]:
    """(parsed, None, attempts) on success, (None, last error, attempts) after the last retry."""
    messages = list(messages)
    error = None
    for attempt in range(1, max_retries + 2):
        text = backend.complete(messages, temperature, max_tokens)
        try:
            return parse(text), None, attempt
        except VerdictError as exc:
            error = str(exc)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": templates.get_template("judge_retry.md.j2").render(error=error)}]
    return None, error, max_retries + 1


def _role_instructions(role: JudgeRoleConfig) -> str:
    name = role.template or f"role_{role.name}.md.j2"
    try:
        return templates.get_template(name).render(role=role.name)
    except TemplateNotFound:
        if role.template:
            raise ValueError(f"judge role {role.name!r}: no template {role.template!r} in {TEMPLATES}") from None
        return templates.get_template("role_default.md.j2").render(role=role.name)


class Judge:
    """One voting role over one backend."""

    def __init__(self, backend: JudgeBackend, role: JudgeRoleConfig, *, records: JudgeRecords | None = None,
                 max_retries: int = 2, max_tokens: int = 256, max_chars: int = 6000) -> None:
        self.backend, self.role, self.records = backend, role, records
        self.max_retries, self.max_tokens, self.max_chars = max_retries, max_tokens, max_chars
        self.instructions = _role_instructions(role)

    @classmethod
    def from_config(cls, backend: JudgeBackend, config: JudgeConfig, role: JudgeRoleConfig,
                    records: JudgeRecords | None = None) -> Judge:
        return cls(backend, role, records=records, max_retries=config.max_retries, max_tokens=config.max_tokens,
                   max_chars=config.max_chars)

    def messages(self, rollout: Rollout) -> list[dict[str, str]]:
        # The verified outcome is not shown: the judge's agreement with it is what backtests measure.
        share = max(200, self.max_chars // max(1, len(rollout.turns) or 1))
        turns = [{"role": t.role, "content": clip(t.content, share)} for t in rollout.turns]
        user = templates.get_template("judge_rollout.md.j2").render(
            prompt=clip(rollout.prompt, self.max_chars), completion=clip(rollout.completion, self.max_chars),
            turns=turns)
        system = templates.get_template("judge_system.md.j2").render(role_instructions=self.instructions)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def judge(self, rollout: Rollout) -> JudgeResult:
        messages = self.messages(rollout)
        key = prompt_hash(messages, temperature=self.role.temperature, max_tokens=self.max_tokens)
        model = self.backend.model
        if self.records is not None:
            hit = self.records.cached(model, key, rollout.id)
            if hit is not None:
                return JudgeResult(rollout.id, self.role.name, model, key, "ok", Verdict.model_validate(hit.verdict),
                                   None, hit.attempts, cached=True)
        verdict, error, attempts = ask(self.backend, messages, parse_verdict, temperature=self.role.temperature,
                                       max_tokens=self.max_tokens, max_retries=self.max_retries)
        status = "ok" if verdict is not None else "missing"
        result = JudgeResult(rollout.id, self.role.name, model, key, status, verdict, error, attempts)
        if self.records is not None:
            self.records.put(StoredVerdict(rollout.id, model, key, self.role.name, "rollout", status,
                                           verdict.model_dump() if verdict is not None else None, error, attempts))
        return result


__all__ = ["Judge", "JudgeResult", "TEMPLATES", "ask", "clip", "prompt_hash", "templates"]
