"""verifiers beside evotrainer (verifiers 0.3.x): what vf-eval saves, written by verifiers' own
`state_to_output` and `save_outputs`, imports with `--from verifiers`; the harness as a Rubric;
and `evotrainer mcp` serves a workspace that holds only imported rollouts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.api import SOURCE_REPORTED
from evotrainer.cli.main import app
from evotrainer.store import Store

save_utils = pytest.importorskip("verifiers.legacy.utils.save_utils")
vf_types = pytest.importorskip("verifiers.legacy.types")

ENV = {"COLUMNS": "200", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}
SECRET = "hunter2-Zq8Lp4Wx"
# (example, question, answer, completion, verifiers' reward, its `correct` metric): example 1's
# second rollout is scored 1.0 by the environment's rubric but is wrong.
ROLLOUTS = [(0, "What is 2 + 3?", "5", "Answer: 5", 1.0, 1.0), (0, "What is 2 + 3?", "5", "Answer: 4", 0.0, 0.0),
            (1, "What is 7 * 6?", "42", "Answer: 42", 1.0, 1.0), (1, "What is 7 * 6?", "42", "Answer: 41", 1.0, 1.0)]


def state(example: int, question: str, answer: str, completion: str, reward: float, correct: float):
    s = vf_types.State()
    s.update({"example_id": example, "prompt": [{"role": "user", "content": question}],
              "completion": [{"role": "assistant", "content": completion}], "answer": answer,
              "info": {"level": 1, "answer": answer},
              "reward": reward, "metrics": {"correct": correct}, "timing": {"generation_ms": 1.0},
              "is_completed": True, "is_truncated": False})
    return s


def vf_eval_results(folder: Path, rollouts=ROLLOUTS) -> Path:
    """results.jsonl as vf-eval writes it: verifiers' own state_to_output, then save_outputs."""
    save_utils.save_outputs([save_utils.state_to_output(state(*r)) for r in rollouts], folder, "a")
    return folder / "results.jsonl"


def cli(*args: str):
    res = CliRunner().invoke(app, list(args), env=ENV)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def stored(work: Path) -> list:
    if not (work / "store.db").exists():
        return []
    with Store.open(work) as store:
        return list(store.iter_rollouts())


def test_vf_evals_results_import_grouped_by_example_and_rechecked(tmp_path):
    vf_eval_results(tmp_path / "outputs" / "evals" / "env--model" / "abc123")
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "verifiers", "--domain", "math", str(tmp_path / "outputs"), "-w", str(work))
    assert res.exit_code == 0, res.output
    assert "imported 4 rollout(s) from verifiers into run 'verifiers' round 0" in res.stdout
    rows = stored(work)
    assert [sr.reward for sr in rows] == [r[4] for r in ROLLOUTS]  # the environment's own reward
    assert [sr.rollout.outcome.success for sr in rows] == [True, False, True, False]  # our recheck
    assert all(sr.reward_components == {"correct": r[5]} for sr, r in zip(rows, ROLLOUTS))
    groups = [sr.rollout.group_id for sr in rows]
    assert groups[0] == groups[1] != groups[2] == groups[3]
    assert rows[0].rollout.completion == "Answer: 5" and rows[0].rollout.prompt == "What is 2 + 3?"


def test_a_metric_as_the_outcome_is_source_reported(tmp_path):
    path = vf_eval_results(tmp_path / "r")
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "verifiers", "--domain", "math", "--outcome-field", "correct", str(path),
              "-w", str(work))
    assert res.exit_code == 0, res.output
    rows = stored(work)
    assert [sr.rollout.outcome.success for sr in rows] == [True, False, True, True]
    assert all(SOURCE_REPORTED in sr.rollout.outcome.flags for sr in rows)


@pytest.mark.parametrize("case, expected", [
    ("truncated", "results.jsonl:2: invalid JSON"),
    ("missing", "results.jsonl:2: missing field(s): 'completion', 'reward'"),
    ("types", "results.jsonl:2: field 'completion' must be text or a list of chat messages"),
])
def test_bad_results_are_one_clear_error_per_line_and_store_nothing(tmp_path, case, expected):
    path = vf_eval_results(tmp_path / "r", ROLLOUTS[:1])
    good = json.loads(path.read_text())
    good["prompt"] = [{"role": "user", "content": SECRET}]
    bad = {"truncated": json.dumps(good)[:40], "missing": json.dumps({k: v for k, v in good.items()
                                                                        if k not in ("completion", "reward")}),
           "types": json.dumps({**good, "completion": 7})}[case]
    path.write_text(json.dumps(good) + "\n" + bad + ("" if case == "truncated" else "\n"))
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "verifiers", "--domain", "math", str(path), "-w", str(work))
    assert res.exit_code == 2 and expected in res.stderr, res.output
    assert "nothing imported" in res.stderr and SECRET not in res.output and stored(work) == []


def test_the_harness_as_a_verifiers_rubric(tmp_path):
    from evotrainer.integrations.verifiers import harness_rubric
    from evotrainer.workspace import ensure_workspace

    work = tmp_path / "work"
    ensure_workspace(work, "math")
    rubric = harness_rubric(work, "main")
    try:
        scored = []
        for r in ROLLOUTS:
            s = state(*r)
            asyncio.run(rubric.score_rollout(s))  # verifiers' own scoring path
            scored.append((s["reward"], s["metrics"]))
    finally:
        rubric.harness_scorer.close()
    name = f"harness_{rubric.harness_commit[:12]}"
    # the seed harness: correct + 0.1 * format, the domain's check deciding "correct"
    assert [reward for reward, _ in scored] == pytest.approx([1.1, 0.1, 1.1, 0.1])
    assert all(set(metrics) == {name} for _, metrics in scored)


def test_mcp_serves_a_workspace_of_imported_rollouts(tmp_path):
    from test_mcp_server import call, initialized, over_mcp  # tests/ is on sys.path

    vf_eval_results(tmp_path / "r")
    work = tmp_path / "work"
    assert cli("rollouts", "import", "--from", "verifiers", "--domain", "math", str(tmp_path / "r"), "-w", str(work)).exit_code == 0
    instructions, answer = initialized(work)
    assert "round 0 of run 'verifiers'" in instructions
    assert answer["ok"] and answer["result"]["total"] == 4, answer

    async def drive(session):
        _, listed = await call(session, "list_rollouts", {})
        return (await call(session, "show_rollout", {"id": listed["result"]["rollouts"][2]["id"]}))[1]

    shown = over_mcp(work, drive)
    assert shown["ok"] and shown["result"]["completion"] == "Answer: 42"
    assert shown["result"]["meta"]["outcome_by"] == "domain:math"
    meta = shown["result"]["meta"]
    assert "answer" not in meta  # the ground truth stays hidden, as for our own tasks,
    assert meta["verifiers"]["info"] == {"level": 1}  # also where the environment put it (info.answer)
    assert "42" not in json.dumps(meta)
