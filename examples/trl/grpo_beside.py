"""A user's own TRL GRPO script with evotrainer beside it: two lines added.

    python examples/trl/grpo_beside.py --workdir work [--model PATH] [--steps N] [--harness]

`StoreRollouts` stores every step's prompts, completions, each reward function's value and TRL's
logged statistics in the workspace (run `trl`, one round per training run); then `evotrainer
diagnose/backtest/report/mcp -w work` work on it as on a run of our own trainer. With --harness
the reward is the workspace harness itself (`harness_rewards`: reward.py and filters.py in an
evotrainer sandbox worker) instead of the script's own functions. Without --model it trains the
embedded SmolLM2-135M (CPU is fine for a few steps).
"""

import argparse

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from evotrainer.integrations.trl import StoreRollouts, harness_rewards


def correct(prompts, completions, answer, **kwargs):
    """The script's own reward: 1.0 when the expected number appears in the completion."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def brevity(prompts, completions, **kwargs):
    return [-0.002 * len(c) for c in completions]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", default="evotrainer-work")
    p.add_argument("--model", default=None)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--harness", action="store_true", help="train on the workspace harness's reward")
    a = p.parse_args()
    if a.model is None:
        from evotrainer.policy.embedded import embedded_model_dir

        a.model = str(embedded_model_dir())
    data = Dataset.from_list([{"prompt": f"What is {x} + {y}? Answer:", "answer": str(x + y)}
                              for x, y in [(2, 3), (4, 4), (7, 5), (9, 1)]])

    rec = StoreRollouts(a.workdir, domain="math")  # evotrainer, line 1: the store beside the run
    funcs = harness_rewards(a.workdir, "main") if a.harness else [correct, brevity]
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(a.model), processing_class=AutoTokenizer.from_pretrained(a.model),
        reward_funcs=rec.watch(funcs),  # evotrainer, line 2: record what each reward function said
        args=GRPOConfig(output_dir=f"{a.workdir}/trl-out", max_steps=a.steps, per_device_train_batch_size=4,
                        num_generations=2, max_completion_length=16, logging_steps=1, save_strategy="no",
                        report_to="none", use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available()),
        train_dataset=data, callbacks=[rec])
    trainer.train()
    print(f"stored {rec.stored} rollouts in {a.workdir} (run {rec.run!r}); next: evotrainer diagnose -w {a.workdir}")


if __name__ == "__main__":
    main()
