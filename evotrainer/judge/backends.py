"""Where judge replies come from: any OpenAI-compatible endpoint, or a local HF model, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from evotrainer.chat import EndpointError, llm_endpoint, openai_client
from evotrainer.config import JudgeConfig


class JudgeBackend(Protocol):
    """A chat model that answers judge prompts. `model` names it in the verdict cache key."""

    model: str

    def complete(self, messages: list[dict[str, str]], temperature: float, max_tokens: int) -> str: ...


BACKENDS: dict[str, Callable[[JudgeConfig], JudgeBackend]] = {}


def register_backend(name: str) -> Callable:
    def deco(factory: Callable[[JudgeConfig], JudgeBackend]) -> Callable[[JudgeConfig], JudgeBackend]:
        BACKENDS[name] = factory
        return factory
    return deco


def make_backend(config: JudgeConfig) -> JudgeBackend:
    try:
        factory = BACKENDS[config.backend]
    except KeyError:
        raise ValueError(f"judge.backend {config.backend!r}: known backends are {', '.join(BACKENDS)}") from None
    return factory(config)


@register_backend("openai")
class OpenAIBackend:
    """`/v1/chat/completions` of any OpenAI-compatible server (vLLM, llama.cpp, Ollama, hosted APIs)."""

    def __init__(self, config: JudgeConfig) -> None:
        self.base_url, self.model, key = llm_endpoint(config.base_url, config.model,
                                                      api_key_env=config.api_key_env, scope="JUDGE")
        self.client = openai_client(
            "judge", self.base_url, self.model, key, config.timeout_s,
            model_hint="set judge.model or EVOTRAINER_JUDGE_MODEL",
            key_hint=f"set {config.api_key_env} (or OPENAI_API_KEY), or judge.base_url for a local endpoint")

    def complete(self, messages: list[dict[str, str]], temperature: float, max_tokens: int) -> str:
        import openai

        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages,
                                                           temperature=temperature, max_tokens=max_tokens)
        except openai.OpenAIError as exc:
            raise EndpointError(f"judge: chat completion at {self.base_url or 'the OpenAI API'} "
                                f"failed: {exc}") from exc
        if not response.choices:
            return ""
        return response.choices[0].message.content or ""


@register_backend("hf")
class HFBackend:
    """A local transformers causal LM (the embedded model by default): chat template, generate."""

    def __init__(self, config: JudgeConfig, model=None, tokenizer=None) -> None:
        ref = config.model or "embedded"
        if model is None or tokenizer is None:
            from evotrainer.policy.load import load_policy

            model, tokenizer = load_policy(ref)
        self.model_obj, self.tokenizer = model, tokenizer
        self.model = f"hf:{ref}"

    def complete(self, messages: list[dict[str, str]], temperature: float, max_tokens: int) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        sample = temperature > 0
        with torch.no_grad():
            out = self.model_obj.generate(**ids, max_new_tokens=max_tokens, do_sample=sample,
                                          temperature=temperature if sample else None,
                                          top_p=None, top_k=None, pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


__all__ = ["BACKENDS", "HFBackend", "JudgeBackend", "OpenAIBackend", "make_backend",
           "register_backend"]
