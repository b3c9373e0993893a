"""The `rollouts` CLI sub-app, run through typer's CliRunner against a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_rollout, make_stored
from typer.testing import CliRunner

from evotrainer.api import Turn
from evotrainer.cli.rollouts import app
from evotrainer.store import Store, StoredRollout

ENV = {"COLUMNS": "200", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}


def make(i: int, kind: str = "ok", turns: tuple[Turn, ...] = (), **extra) -> StoredRollout:
    ok = kind == "ok"
    return make_stored(
        make_rollout(f"roll-{i:04d}", task_id=f"task-{i % 3}", group_id=f"g{i // 2}", prompt=f"prompt {i}",
                     completion=f"completion [red]{i}[/red]", turns=turns, success=ok, kind=kind, flags=("f1",),
                     num_tokens=5 + i, meta={"level": 1}),
        reward_components={"correct": float(ok), "format": 0.25}, reward=float(ok) + 0.25,
        advantage=0.5 if ok else -0.5, kept=ok, model_version="base", seed=i,
        harness_version="h0", **extra,
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    workdir = tmp_path / "work"
    with Store.open(workdir) as store:
        run = store.get_or_create_run("demo", "math", {})
        r0 = store.start_round(run, 0, "h0", "base")
        r1 = store.start_round(run, 1, "h0", "base")
        multi = (Turn("user", "fix the bug"), Turn("assistant", "edit: [x]"), Turn("tool", "tests pass"))
        store.add_rollouts(
            [make(i, "ok" if i % 2 else "wrong", run_id=run, round_id=r0 if i < 4 else r1)
             for i in range(6)]
            + [make(99, "timeout", turns=multi, run_id=run, round_id=r1)])
    return workdir


def cli(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), env=ENV, input=input)


def test_ls_lists_and_filters(work: Path) -> None:
    res = cli("ls", "--workdir", str(work))
    assert res.exit_code == 0, res.output
    assert "7 rollout(s)" in res.stdout and "roll-0000" in res.stdout and "roll-0099" in res.stdout
    res = cli("ls", "-w", str(work), "--run", "demo", "--round", "0", "--kind", "ok")
    assert res.exit_code == 0 and "2 rollout(s)" in res.stdout
    res = cli("ls", "-w", str(work), "--limit", "3", "--json")
    assert [r["id"] for r in json.loads(res.stdout)] == ["roll-0000", "roll-0001", "roll-0002"]
    assert cli("ls", "-w", str(work), "--kind", "great").exit_code != 0
    res = cli("ls", "-w", str(work), "--run", "nope")
    assert res.exit_code == 2 and "no run named 'nope'" in res.stderr


def test_workdir_from_env_and_missing_store(work: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["ls"], env={**ENV, "EVOTRAINER_WORKDIR": str(work)})
    assert res.exit_code == 0 and "7 rollout(s)" in res.stdout
    res = cli("ls", "-w", str(tmp_path / "empty"))
    assert res.exit_code == 2 and "no store" in res.stderr
    assert not (tmp_path / "empty").exists()  # reading never creates a store


def test_show_renders_rollout_and_unknown_id_fails(work: Path) -> None:
    res = cli("show", "roll-0001", "-w", str(work))
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in ["task-1", "reward components", "correct", "format", "prompt 1",
                 "completion [red]1[/red]", "h0", "base"]:
        assert text in out, text
    res = cli("show", "roll-0099", "-w", str(work))
    assert "turn 1 · user" in res.stdout and "turn 3 · tool" in res.stdout and "edit: [x]" in res.stdout
    assert "timeout" in res.stdout
    res = cli("show", "roll-0099", "-w", str(work), "--json")
    assert json.loads(res.stdout)["meta"]["train"]["reward_components"]["format"] == 0.25
    res = cli("show", "nope", "-w", str(work))
    assert res.exit_code == 2 and "no rollout" in res.stderr
    res = cli("show", "roll-", "-w", str(work))
    assert res.exit_code == 2 and "ambiguous" in res.stderr
    assert cli("show", "roll-0003", "-w", str(work)).exit_code == 0  # exact id beats prefix


def test_export_then_import_round_trip(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.jsonl"
    res = cli("export", str(out), "-w", str(work))
    assert res.exit_code == 0 and "exported 7" in res.stderr
    res = cli("export", "-", "-w", str(work), "--round", "1")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 3

    fresh = tmp_path / "fresh"
    fresh.mkdir()  # import never creates a workspace folder: a mistyped --workdir is an error
    res = cli("import", str(out), "-w", str(fresh))
    assert res.exit_code == 0 and "imported 7" in res.stdout
    again = tmp_path / "again.jsonl"
    assert cli("export", str(again), "-w", str(fresh)).exit_code == 0
    assert out.read_bytes() == again.read_bytes()

    (tmp_path / "stdin").mkdir()
    res = cli("import", "-", "-w", str(tmp_path / "stdin"), input=out.read_text(encoding="utf-8"))
    assert res.exit_code == 0 and "imported 7" in res.stdout


def test_import_bad_file_exits_1_and_stores_nothing(work: Path, tmp_path: Path) -> None:
    good = (work.parent / "good.jsonl")
    assert cli("export", str(good), "-w", str(work), "--limit", "2").exit_code == 0
    lines = good.read_text(encoding="utf-8").splitlines()
    bad = json.loads(lines[1])
    bad["outcome"]["kind"] = "great"
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([lines[0], "oops", json.dumps(bad), lines[0]]) + "\n", encoding="utf-8")

    target = tmp_path / "target"
    target.mkdir()
    res = cli("import", str(path), "-w", str(target))
    assert res.exit_code == 2
    for expected in [f"{path}:2: invalid JSON", f"{path}:3: field 'outcome'", f"{path}:4: duplicate id"]:
        assert expected in res.stderr, res.stderr
    with Store.open(target) as store:
        assert store.count_rollouts() == 0

    res = cli("import", str(path), "-w", str(target), "--skip-bad")
    assert res.exit_code == 0 and "imported 1 rollout(s), skipped 3" in res.stdout
    assert f"{path}:3:" in res.stderr
    with Store.open(target) as store:
        assert store.count_rollouts() == 1
    assert cli("import", str(tmp_path / "missing.jsonl"), "-w", str(target)).exit_code == 2
