"""OpenAI-compatible chat endpoints, shared by the llm agent, the experience distiller and judges:
the client from config or environment, the JSON read out of a model's reply, and the two ways a
call fails (EndpointError, ReplyError)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from evotrainer.errors import EvotrainerError, UserError

JSON_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)


class EndpointError(UserError, RuntimeError):
    """The endpoint could not be reached or rejected the request (after the SDK's own retries);
    the message names the caller and the endpoint."""


class ReplyError(EvotrainerError, ValueError):
    """A reply (or a part of it) the caller cannot use; the message goes back to the model."""


def first_env(names: Sequence[str | None]) -> str | None:
    """The first of these environment variables that is set and not empty."""
    return next((os.environ[n] for n in names if n and os.environ.get(n)), None)


def llm_endpoint(base_url: str | None, model: str | None, api_key: str | None = None,
                 api_key_env: str | None = None, scope: str | None = None) -> tuple[str | None, str | None, str | None]:
    """(base URL, model, API key): each argument, else the environment. EVOTRAINER_<SCOPE>_BASE_URL
    and _MODEL come first when a scope is given (the judges': JUDGE), then EVOTRAINER_LLM_* and
    OPENAI_BASE_URL; the key from the variable named by `api_key_env`, else
    EVOTRAINER_LLM_API_KEY, else OPENAI_API_KEY."""
    prefixes = ([f"EVOTRAINER_{scope}"] if scope else []) + ["EVOTRAINER_LLM"]
    base_url = base_url or first_env([f"{p}_BASE_URL" for p in prefixes] + ["OPENAI_BASE_URL"])
    model = model or first_env([f"{p}_MODEL" for p in prefixes])
    key = api_key or first_env([api_key_env, "EVOTRAINER_LLM_API_KEY", "OPENAI_API_KEY"])
    return base_url, model, key


def openai_client(who: str, base_url: str | None, model: str | None, api_key: str | None,
                  timeout_s: float, *, model_hint: str, key_hint: str):
    """An `openai.OpenAI` client; `who: no model; <model_hint>` (or no key) as ValueError. A local
    endpoint (a base URL is set) may need no key: local servers ignore it, the SDK wants one."""
    from openai import OpenAI  # imported here: commands that never call an endpoint skip the SDK

    if not model:
        raise ValueError(f"{who}: no model; {model_hint}")
    if not api_key:
        if not base_url:
            raise ValueError(f"{who}: no API key; {key_hint}")
        api_key = "not-needed"
    return OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s)


def reply_json(text: str, want: type | None = None) -> tuple[Any, str | None]:
    """The JSON in a reply: each ```json fence, then the whole text, then its outermost {...} span;
    the first that parses (and, with `want`, is of that type). Returns (value, None), or
    (None, the first problem met) when none does."""
    candidates = [m.group(1) for m in JSON_FENCE.finditer(text)] + [text]
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{"): text.rindex("}") + 1])
    problem = None
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError as exc:
            problem = problem or f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            continue
        if want is None or isinstance(data, want):
            return data, None
        problem = problem or f"expected a JSON object, got {type(data).__name__}"
    return None, problem


__all__ = ["JSON_FENCE", "EndpointError", "ReplyError", "first_env", "openai_client", "reply_json"]
