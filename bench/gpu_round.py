"""GPU figures on the embedded SmolLM2-135M: generation tokens/s with HF and with vLLM (and the
ratio), the time of one GRPO step, and the time of one full coevolve round. Run by
bench/gpu_round.sh; prints a table and writes <out>/gpu_round.json."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

from evotrainer.console import make_console


def ensure_model() -> Path:
    """The converted embedded model; from a carried GGUF (EVOTRAINER_GGUF) when given one."""
    from evotrainer.policy.embedded import _convert, embedded_model_dir, evotrainer_home

    target = evotrainer_home() / "models" / "smollm2-135m-instruct"
    gguf = os.environ.get("EVOTRAINER_GGUF")
    if gguf and not (target / "model.safetensors").is_file():
        _convert(Path(gguf), target)  # the same conversion `embedded` runs on first use
    return embedded_model_dir()


def tokens_per_s(backend, prompts, max_new: int) -> tuple[float, int, float]:
    backend.generate(prompts[:4], 8)  # warm-up: kernels, CUDA graphs, allocator
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gens = backend.generate(prompts, max_new)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n = sum(g.num_tokens for g in gens)
    return n / dt, n, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    import torch
    from rich.table import Table

    from evotrainer.cli.main import quiet_libraries
    from evotrainer.coevolve import Coevolution
    from evotrainer.config import load_config
    from evotrainer.policy import load_policy
    from evotrainer.policy.backends import get_backend
    from evotrainer.train.loop import open_session, run_training

    quiet_libraries()
    console = make_console(stderr=True)
    assert torch.cuda.is_available(), "bench/gpu_round.py needs a CUDA GPU"
    model_dir = ensure_model()
    work = Path(tempfile.mkdtemp(prefix="gpu-round-"))
    base = ["domain.train_size=64", f"domain.heldout_size={args.prompts}", "train.prompts_per_step=4",
            "eval.batch_size=64", f"eval.max_new_tokens={args.max_new}", "train.report_to=[]"]
    cfg = load_config(None, base, domain="math")
    session = open_session(cfg, work / "gen", console)
    prompts = session.harness.render_prompts([t.prompt for t in session.heldout[0]])
    rows: dict[str, object] = {"gpu": torch.cuda.get_device_name(0), "prompts": len(prompts),
                               "max_new_tokens": args.max_new}

    model, tok = load_policy("embedded")
    hf = get_backend("hf", model=model.to("cuda"), tokenizer=tok, batch_size=len(prompts))
    rows["hf_tokens_per_s"], rows["hf_tokens"], rows["hf_s"] = tokens_per_s(hf, prompts, args.max_new)
    del hf, model
    torch.cuda.empty_cache()
    if importlib.util.find_spec("vllm") is not None:
        vl = get_backend("vllm", model_path=str(model_dir), gpu_memory_utilization=0.25)
        rows["vllm_tokens_per_s"], rows["vllm_tokens"], rows["vllm_s"] = tokens_per_s(vl, prompts, args.max_new)
        rows["vllm_over_hf"] = rows["vllm_tokens_per_s"] / rows["hf_tokens_per_s"]
        del vl
    else:
        rows["vllm"] = "not installed on this machine (pip install '.[gpu]'); no vLLM figure"

    t0 = time.perf_counter()
    train = run_training(open_session(cfg, work / "train", console), rounds=1, steps=args.steps)
    rows["grpo_step_s"] = train["rounds"][0].step_time
    rows["train_round_s"] = time.perf_counter() - t0

    co_cfg = load_config(None, [*base, f"train.steps_per_round={args.steps}"], domain="math")
    t0 = time.perf_counter()
    Coevolution(co_cfg, work / "coevolve", console).run(1)
    rows["coevolve_round_s"] = time.perf_counter() - t0

    table = Table(title=f"evotrainer GPU round on {rows['gpu']} (embedded SmolLM2-135M)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for k, v in rows.items():
        table.add_row(k, f"{v:.2f}" if isinstance(v, float) else str(v))
    make_console().print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_round.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
