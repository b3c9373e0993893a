"""evotrainer: LoRA + GRPO training with a harness that an outer agent co-evolves."""

__version__ = "0.1.0"
