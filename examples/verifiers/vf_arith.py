"""A small verifiers environment in the classic API: two-number arithmetic, answer in <answer> tags.

It is written the way a published environment is (load_environment returning a vf.SingleTurnEnv
with a dataset, an eval_dataset and a Rubric over an XMLParser), so `domain.name: verifiers` can
be tried without downloading anything: configs/verifiers-tiny.yaml points at this file.
"""

import random

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Think briefly, then give only the number as <answer>N</answer>."


def _rows(rng: random.Random, n: int, ops: str) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append({"question": f"What is {a} {op} {b}?", "answer": str(value), "info": {"op": op}})
    return rows


def load_environment(num_train: int = 500, num_eval: int = 100, seed: int = 0, ops: str = "+-*"):
    rng = random.Random(seed)
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2],
                       parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(_rows(rng, num_train, ops)),
                            eval_dataset=Dataset.from_list(_rows(rng, num_eval, ops)),
                            system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric)
