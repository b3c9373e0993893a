"""The validation split: carved from the train pool, never trained on, and what coevolve decides on."""

from __future__ import annotations

import pytest
from factories import make_rollout, make_stored

from evotrainer.coevolve.heldout import HeldoutLeak, assert_no_heldout_rollouts, decision_split, round_history
from evotrainer.coevolve.verify import verify
from evotrainer.config import load_config
from evotrainer.domains import build_domain
from evotrainer.domains.base import Task
from evotrainer.paths import CONFIGS_DIR
from evotrainer.store import Store
from evotrainer.train.splits import carve_validation

TINY = CONFIGS_DIR / "math-tiny.yaml"


def tasks(n: int) -> list[Task]:
    return [Task(f"t{i}", "math", "train", 0, f"What is {i} + 1?", str(i + 1)) for i in range(n)]


def test_the_carve_keeps_the_train_draw_and_marks_validation():
    train, val = carve_validation(tasks(12), 8, 4)
    assert [t.task_id for t in train] == [f"t{i}" for i in range(8)]
    assert [t.task_id for t in val] == ["t8", "t9", "t10", "t11"]
    assert {t.split for t in train} == {"train"} and {t.split for t in val} == {"validation"}
    # a short pool: validation takes at most a quarter of it, training the rest
    train, val = carve_validation(tasks(10), 64, 8)
    assert len(val) == 2 and len(train) == 8
    assert carve_validation(tasks(5), 4, 0) == (tasks(4), [])
    # too small to spare a task: no validation split (the held-out split then decides)
    assert carve_validation(tasks(3), 4, 4) == (tasks(3), [])


def test_the_math_draw_is_prefix_stable_so_train_tasks_do_not_change():
    cfg = load_config(TINY, [])
    domain = build_domain(cfg.domain, judge=cfg.judge)
    d = cfg.domain
    without = domain.tasks("train", d.train_size, d.seed)
    train, val = carve_validation(domain.tasks("train", d.train_size + d.validation_size, d.seed),
                                  d.train_size, d.validation_size)
    assert [t.task_id for t in train] == [t.task_id for t in without]
    assert len(val) == d.validation_size and not {t.task_id for t in val} & {t.task_id for t in train}


def test_coevolve_decides_on_validation_unless_the_run_has_none():
    assert decision_split([{"split": "heldout"}, {"split": "validation"}]) == "validation"
    assert decision_split([{"split": "heldout"}]) == "heldout" and decision_split([]) == "heldout"


def test_round_history_and_verdicts_name_the_split(tmp_path):
    with Store.open(tmp_path) as store:
        run = store.get_or_create_run("r", "math", {})
        for idx, (val, held, reward) in enumerate([(4, 2, 0.2), (1, 2, 0.6)]):
            rnd = store.start_round(run, idx, "h", "base")
            store.add_eval(run, rnd, "validation", f"a{idx}", 0, 8, val, {})
            store.add_eval(run, rnd, "heldout", f"a{idx}", 0, 8, held, {})
            store.finish_round(rnd, {"train_reward": reward}, f"a{idx}")
        history = round_history(store, run, "validation")
        evals = store.evals(run)
    assert [(h["split"], h["success"], h["n"]) for h in history] == [("validation", 0.5, 8), ("validation", 0.125, 8)]
    by = lambda split, i: [e for e in evals if e["split"] == split and e["round_index"] == i]  # noqa: E731
    verdict = verify(by("validation", 0), by("validation", 1), z=1.0)
    assert verdict.split == "validation" and verdict.regressed
    assert verdict.describe().startswith("validation success 0.500 -> 0.125")
    assert not verify(by("heldout", 0), by("heldout", 1), z=1.0).regressed


def test_a_rollout_of_a_validation_task_is_a_leak(tmp_path):

    with Store.open(tmp_path) as store:
        store.upsert_tasks("math", [{"task_id": "v1", "split": "validation", "level": 0, "prompt": "p",
                                     "answer": "1", "meta": {}}])
        store.add_rollouts([make_stored(make_rollout("r1", task_id="v1", prompt="p", completion="1", success=True,
                                                     num_tokens=1))])
        with pytest.raises(HeldoutLeak, match="validation task v1"):
            assert_no_heldout_rollouts(store)
