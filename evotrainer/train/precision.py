"""The precision of the loss's forward pass (`train.precision`).

`bf16` runs the policy's log-prob passes (the loss's forward, and any old-policy or reference pass
TRL makes) under bfloat16 autocast: matrix products in bf16 with float32 accumulation, the weights,
the optimizer state and the LoRA update kept in float32, and the per-token log-probs and entropies
handed back as float32. Generation and evaluation stay float32, so sampling and the measured
success rates do not change with the setting. `auto` picks bf16 where the hardware multiplies bf16
natively (a CUDA card that supports it; a CPU with AMX or AVX512-BF16, read from /proc/cpuinfo on
Linux) and float32 elsewhere: on a CPU without those instructions bf16 is emulated and slower.

On this project's 2-core AMX CPU, bench/step_profile.py measures the default math step's loss
forward and backward with each setting side by side.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

Precision = Literal["auto", "fp32", "bf16"]
_NATIVE_CPU_FLAGS = {"amx_bf16", "avx512_bf16"}


@cache
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU lists an instruction set that multiplies bf16 natively (Linux only)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    return any(_NATIVE_CPU_FLAGS & set(line.split(":", 1)[1].split())
               for line in text.splitlines() if line.startswith("flags"))


def loss_dtype(precision: Precision, device_type: str):
    """The autocast dtype for the loss's forward pass on `device_type` ("cpu", "cuda"), or None
    for float32."""
    import torch

    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    native = torch.cuda.is_bf16_supported() if device_type == "cuda" else cpu_has_native_bf16()
    return torch.bfloat16 if native else None


__all__ = ["Precision", "cpu_has_native_bf16", "loss_dtype"]
