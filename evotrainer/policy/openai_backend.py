"""The `openai` generation backend: greedy chat completions from any OpenAI-compatible server.

With an adapter, the backend first asks the server to load it (`POST /v1/load_lora_adapter`,
vLLM's runtime LoRA endpoint; start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and
`--enable-lora`), then requests completions from the adapter by name. The server must see the
adapter folder at the same path (same machine or a shared file system).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evotrainer.policy.backends import BackendUnavailable, Generation
from evotrainer.policy.load import adapter_version


class OpenAIBackend:
    name = "openai"

    def __init__(self, base_url: str | None, model: str | None = None, api_key: str | None = None,
                 load_adapter: bool = True, concurrency: int = 8, timeout_s: float = 120.0):
        import openai

        if not base_url:
            raise BackendUnavailable("eval.backend=openai needs eval.server.base_url "
                                     "(e.g. http://127.0.0.1:8000/v1)")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or "EMPTY"  # local servers ignore it; the SDK insists on one
        self.client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=timeout_s,
                                    max_retries=1)
        self.timeout_s = timeout_s
        self.load_adapter = load_adapter
        self.concurrency = concurrency
        try:
            self.base_model = model or self.client.models.list().data[0].id
        except (openai.APIError, IndexError) as exc:
            raise BackendUnavailable(f"no model to evaluate at {self.base_url}: {exc}") from None
        self.model = self.base_model
        self.loaded: list[str] = []  # adapter names this backend asked the server to load

    def use_adapter(self, adapter: str | Path | None) -> None:
        if adapter is None:
            self.model = self.base_model
            return
        # Named by content: the same weights keep one name, so a second load is a no-op.
        name = adapter_version(adapter)
        if self.load_adapter and name not in self.loaded:
            self._load(name, Path(adapter).resolve())
            self.loaded.append(name)
        self.model = name

    def _load(self, name: str, path: Path) -> None:
        import json
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            f"{self.base_url}/load_lora_adapter", method="POST",
            data=json.dumps({"lora_name": name, "lora_path": str(path)}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s):
                return
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            raise BackendUnavailable(f"cannot reach {self.base_url}: {exc}") from None
        # vLLM answers 400 for a name it already holds; with content names that is the same adapter.
        if status == 400 and "already" in text.lower():
            return
        raise BackendUnavailable(f"{self.base_url}/load_lora_adapter refused {path} "
                                 f"(HTTP {status}): {text[:300]}")

    def _one(self, prompt: str, max_new_tokens: int) -> Generation:
        resp = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}],
            temperature=0.0, max_tokens=max_new_tokens)
        choice = resp.choices[0]
        text = choice.message.content or ""
        tokens = resp.usage.completion_tokens if resp.usage else len(text.split())
        return Generation(text, choice.finish_reason == "length", tokens)

    def generate(self, prompts: Sequence[str], max_new_tokens: int,
                 on_batch: Callable[[int], None] | None = None) -> list[Generation]:
        out: list[Generation] = []
        with ThreadPoolExecutor(self.concurrency) as pool:
            for gen in pool.map(lambda p: self._one(p, max_new_tokens), prompts):
                out.append(gen)
                if on_batch:
                    on_batch(1)
        return out
