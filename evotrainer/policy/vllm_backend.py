"""The `vllm` generation backend: one vllm.LLM engine over the base model, the round's LoRA
adapter applied per request (LoRARequest), so a new round needs no engine restart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evotrainer.policy.backends import Generation, require_vllm, vllm_lora_rank
from evotrainer.policy.load import adapter_version


class VLLMBackend:
    name = "vllm"

    def __init__(self, model_path: str, lora_rank: int = 16, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, seed: int = 0, dtype: str = "auto"):
        require_vllm("eval with vLLM")
        from vllm import LLM

        self.llm = LLM(model=str(model_path), enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank),
                       max_loras=1, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, seed=seed, dtype=dtype)
        self.tokenizer = self.llm.get_tokenizer()
        self._ids: dict[str, int] = {}  # adapter content hash -> vLLM's int id for it
        self._lora = None

    def use_adapter(self, adapter: str | Path | None) -> None:
        from vllm.lora.request import LoRARequest

        if adapter is None:
            self._lora = None
            return
        path = str(Path(adapter).resolve())
        if not (Path(path) / "adapter_config.json").is_file():
            raise FileNotFoundError(f"not a PEFT adapter folder: {adapter}")
        # vLLM caches an adapter by its int id: key it by content, so a folder rewritten by a
        # resumed round is loaded afresh and the same weights are never loaded twice.
        version = adapter_version(path)
        lora_id = self._ids.setdefault(version, len(self._ids) + 1)
        self._lora = LoRARequest(version, lora_id, path)

    def generate(self, prompts: Sequence[str], max_new_tokens: int,
                 on_batch: Callable[[int], None] | None = None) -> list[Generation]:
        from vllm import SamplingParams

        from evotrainer.policy.hf_backend import chat_prompt

        # Token ids, not text: the same chat template and no extra BOS, exactly as the hf backend.
        requests = [{"prompt_token_ids": self.tokenizer(chat_prompt(self.tokenizer, p),
                                                        add_special_tokens=False)["input_ids"]}
                    for p in prompts]
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        outputs = self.llm.generate(requests, params, lora_request=self._lora, use_tqdm=False)
        out = []
        for o in outputs:
            c = o.outputs[0]
            out.append(Generation(c.text, c.finish_reason == "length", len(c.token_ids)))
        if on_batch:
            on_batch(len(prompts))
        return out
