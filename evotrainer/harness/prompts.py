"""Prompts are rendered by the trusted side, from data: the PROMPT string and the task's question.

A prompt decides what the policy is asked, in training and in validation and held-out evaluation
alike, so harness code must not be able to write into it. Rendering used to happen in the harness
worker, next to rollout.py's code, which could wrap the renderer and append each question's answer
as a "hint" (held-out success of an untrained model rose from 0.29 to 0.54). Now:

- the template is rollout.py's PROMPT as *text*, read without running the file
  (loader.py `prompt_template`): what rollout.py does at run time cannot change it;
- the only inputs are the question (the task's prompt) and the domain's scaffold name
  (`PROMPT_INPUTS`). The answer and every hidden field (reference solution, tests, gold patch)
  are never passed, so a template that names one fails on StrictUndefined;
- rendering runs in a sandbox worker of its own that never loads harness code (a SandboxPool with
  no harnesses): Jinja's sandbox stops a template from reaching Python, and the worker's time and
  memory limits stop a template that loops or allocates without bound, away from the trainer.

A candidate that changes PROMPT is judged by the live pilot, never by replay alone
(coevolve/pilot.py `dynamics_change`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from evotrainer.harness.errors import HarnessError
from evotrainer.harness.sandbox import CandidateFailure, SandboxLimits, SandboxPool

PROMPT_INPUTS = ("question", "scaffold")
# Rendering a round's prompts takes milliseconds; a template still running after this is runaway.
LIMITS = SandboxLimits(memory_limit_mb=1024, message_timeout_s=30.0)
_ERROR_CHARS = 500


@dataclass(frozen=True)
class PromptCalls:
    """In the prompt worker (no harness loaded): render one template for a batch of questions."""

    def open(self, trusted_io: Callable[[], AbstractContextManager[None]]) -> None:
        return None

    def run(self, state: None, harnesses: Mapping[str, Any], message: tuple) -> list:
        from jinja2 import StrictUndefined
        from jinja2.sandbox import SandboxedEnvironment

        template_text, items = message
        try:
            env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
            template = env.from_string(template_text)
            return ["ok", [template.render(question=question, **extra) for question, extra in items]]
        except Exception as exc:  # a template error, a sandbox refusal, MemoryError, RecursionError
            return ["error", f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]]


class PromptRenderer:
    """One prompt worker, started on first use and again after a template killed it."""

    def __init__(self, limits: SandboxLimits = LIMITS) -> None:
        self.limits = limits
        self._pool: SandboxPool | None = None
        self._lock = threading.Lock()

    def render(self, template: str, questions: Sequence[str], scaffold: str | None = None) -> list[str]:
        """`template` rendered for each question (with `scaffold` when given); HarnessError naming
        rollout.py's PROMPT for anything the template does wrong."""
        if not isinstance(template, str):
            raise HarnessError(f"rollout.py: PROMPT is {type(template).__name__}, expected a Jinja template string")
        if not questions:
            return []
        extra = {} if scaffold is None else {"scaffold": str(scaffold)}
        message = (template, [(str(q), extra) for q in questions])
        with self._lock:
            try:
                if self._pool is None:
                    pool = SandboxPool([], PromptCalls(), 1, self.limits)
                    pool.__enter__()
                    self._pool = pool
                reply = next((r for _, r in self._pool.imap([message])), None)
            except CandidateFailure as failure:  # the template ran past the limits: the worker is gone
                self.close_locked()
                raise HarnessError(f"rollout.py: rendering PROMPT failed: {failure.reason}") from None
        if not (isinstance(reply, list) and len(reply) == 2):
            raise HarnessError("rollout.py: rendering PROMPT gave no reply")
        status, value = reply
        if status != "ok":
            raise HarnessError(f"rollout.py: rendering PROMPT raised {value}")
        if not (isinstance(value, list) and len(value) == len(questions) and all(isinstance(v, str) for v in value)):
            raise HarnessError("rollout.py: rendered prompts did not come back as one string per question")
        return value

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


_shared = PromptRenderer()
atexit.register(_shared.close)


def render_prompts(template: str, questions: Sequence[str], scaffold: str | None = None) -> list[str]:
    """The prompts of `questions` under `template`, rendered by this process's prompt worker."""
    return _shared.render(template, questions, scaffold)
