"""The validation split: tasks carved from the train pool that training never sees.

A domain partitions its tasks into train and held-out. Coevolve needs a third set that decides
(verifying a promotion, the control arm's comparison, the reward-hacking score) without using
the held-out split, which would otherwise be tuned against round after round and stop being an
honest final measure. The trainer draws `train_size + validation_size` tasks from the train pool
and moves the last `validation_size` of them to "validation": the train tasks are the same ones a
run without a validation split draws whenever the domain's draw is prefix-stable (the procedural
math and code pools are), and the carve is the same on every resume.
"""

from __future__ import annotations

from dataclasses import replace

from evotrainer.domains.base import Task


def carve_validation(pool: list[Task], train_size: int, validation_size: int) -> tuple[list[Task], list[Task]]:
    """(train, validation) from a draw of up to `train_size + validation_size` train tasks. From a
    pool that came up short, validation takes at most a quarter of it (none from fewer than four
    tasks: then the held-out split decides, and the session says so) and training the rest."""
    wanted = train_size + validation_size
    n_val = validation_size if len(pool) >= wanted else min(validation_size, len(pool) // 4)
    if n_val <= 0:
        return pool[:train_size], []
    train, validation = pool[:len(pool) - n_val], pool[len(pool) - n_val:]
    return train[:train_size], [replace(t, split="validation") for t in validation]
