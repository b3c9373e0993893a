"""The rollout store and its JSONL format, against real SQLite files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from evotrainer.api import Outcome, Rollout, Turn
from evotrainer.store import ImportErrors, Store, StoredRollout, export_jsonl, import_jsonl


def make(i: int, *, task: str = "t0", domain: str = "math", kind: str = "ok", **train) -> StoredRollout:
    success = kind == "ok"
    rollout = Rollout(
        id=f"r{i:05d}", task_id=task, group_id=f"g{i // 4}", domain=domain,
        prompt=f"What is {i} + 1?", completion=f"The answer is [b]{i + 1}[/b] ✓",
        turns=(Turn("user", "hi"), Turn("assistant", f"{i + 1}")) if i % 2 else (),
        outcome=Outcome(success, 1.0 if success else 0.0, kind, ("empty",) if kind == "empty" else ()),
        num_tokens=10 + i, truncated=kind == "truncated", meta={"level": i % 3, "tags": ["a", "b"]},
    )
    fields = dict(reward_components={"correct": float(success), "len": -0.01 * i}, reward=float(success),
                  advantage=0.5 if success else -0.5, kept=i % 3 != 0, model_version="base",
                  seed=1234 + i, harness_version="abc123", step=i // 8)
    fields.update(train)
    return StoredRollout(rollout=rollout, **fields)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "work") as s:
        yield s


def test_open_makes_workdir_and_sqlite_file_in_wal_mode(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a" / "b") as s:
        assert (tmp_path / "a" / "b" / "store.db").is_file()
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_rollout_round_trip_keeps_every_field(store: Store) -> None:
    run = store.get_or_create_run("r1", "math", {"lr": 1e-5})
    rnd = store.start_round(run, 0, "sha0", "base")
    sr = StoredRollout(
        rollout=Rollout(
            id="abc-1", task_id="t7", group_id="g1", domain="math", prompt="p ü", completion="c",
            turns=(Turn("system", "s"), Turn("user", "u"), Turn("assistant", "a")),
            outcome=Outcome(False, 0.25, "tampering", ("tampering", "empty")),
            num_tokens=42, truncated=True, meta={"nested": {"x": [1, 2.5, None]}, "s": "é"},
        ),
        reward_components={"correct": 0.0, "format": 0.5, "len": -0.125},
        reward=0.375, advantage=-1.5, kept=False, model_version="adapter-9f", seed=2**40,
        harness_version="deadbeef", run_id=run, round_id=rnd, step=17,
    )
    store.add_rollouts([sr])
    # a fresh Store on the same file proves it was committed, not cached
    with Store(store.url) as again:
        assert again.get_rollout("abc-1") == sr
        assert again.get_rollout("abc") == sr  # unique prefix
        assert again.get_rollout("zzz") is None


def test_ambiguous_prefix_and_reserved_meta_key(store: Store) -> None:
    store.add_rollouts([make(1), make(2)])
    with pytest.raises(ValueError, match="ambiguous"):
        store.get_rollout("r0000")
    bad = make(3)
    bad = StoredRollout(rollout=Rollout(**{**bad.rollout.__dict__, "meta": {"train": 1}}))
    with pytest.raises(ValueError, match="reserved"):
        store.add_rollouts([bad])
    assert store.count_rollouts() == 2


def test_add_rollouts_is_atomic_on_duplicate_id(store: Store) -> None:
    store.add_rollouts([make(1)])
    with pytest.raises(IntegrityError):
        store.add_rollouts([make(2), make(1)])
    assert store.count_rollouts() == 1


def test_runs_rounds_and_evals(store: Store) -> None:
    run = store.get_or_create_run("r", "math", {"a": 1})
    assert store.get_or_create_run("r", "math", {"a": 2}) == run
    with pytest.raises(ValueError):
        store.get_or_create_run("r", "code", {})
    assert store.last_finished_round(run) is None
    r0 = store.start_round(run, 0, "h0", "base")
    assert store.start_round(run, 0, "h0", "base") == r0  # resume
    store.finish_round(r0, {"loss": 0.1}, "adapters/0")
    r1 = store.start_round(run, 1, "h1", "a0")
    assert r1 != r0
    assert store.last_finished_round(run) == (0, "adapters/0")
    store.finish_round(r1, {}, None)
    assert store.last_finished_round(run) == (1, None)
    ev = store.add_eval(run, r1, "heldout", "adapters/1", 7, 40, 10, {"ok": 10, "wrong": 30})
    [row] = store.evals(run)
    assert row["id"] == ev and row["round_index"] == 1 and row["success_rate"] == 0.25
    assert row["details"] == {"ok": 10, "wrong": 30}


def test_a_round_started_over_sets_the_dead_attempt_aside(store: Store) -> None:
    """A crash mid-round leaves rollouts and an eval; training the round again must not count
    them as the round's: they move to `<run>~abandoned`, kept and marked, and the round is empty."""
    run = store.get_or_create_run("r", "math", {})
    r0 = store.begin_round(run, 0, "h0", "base")
    store.finish_round(r0, {}, "adapters/0")
    r1 = store.begin_round(run, 1, "h0", "a0")
    store.add_rollouts([make(i, run_id=run, round_id=r1) for i in range(6)])
    store.add_eval(run, r1, "heldout", "adapters/1", 0, 8, 2, {})
    assert store.begin_round(run, 1, "h1", "a0") == r1  # the crash; training starts round 1 over
    assert store.count_rollouts(run_id=run, round_index=1) == 0
    assert [e for e in store.evals(run) if e["round_id"] == r1] == []
    aside = store.run_id("r~abandoned")
    assert store.count_rollouts(run_id=aside) == 6
    [attempt] = store.rounds(aside)
    assert attempt["metrics"]["abandoned"] == {"run": "r", "round": 1, "rollouts": 6, "evals": 1}
    assert [r["harness_version"] for r in store.rounds(run)] == ["h0", "h1"]
    store.add_rollouts([make(10 + i, run_id=run, round_id=r1) for i in range(2)])
    assert store.begin_round(run, 1, "h1", "a0") == r1  # a second crash: a second attempt aside
    assert [r["index"] for r in store.rounds(aside)] == [1, 2] and store.count_rollouts(run_id=aside) == 8
    store.finish_round(r1, {}, None)
    with pytest.raises(ValueError, match="finished"):
        store.begin_round(run, 1, "h1", "a0")


def test_iter_rollouts_filters_chunks_and_limit(store: Store) -> None:
    run_a = store.get_or_create_run("a", "math", {})
    run_b = store.get_or_create_run("b", "math", {})
    ra0, ra1 = store.start_round(run_a, 0, "h", "m"), store.start_round(run_a, 1, "h", "m")
    rb0 = store.start_round(run_b, 0, "h", "m")
    rows = []
    # ids inserted in descending order: iteration must follow insert order, not id order
    for i in range(250, 0, -1):
        run, rnd = [(run_a, ra0), (run_a, ra1), (run_b, rb0)][i % 3]
        sr = make(i, domain="code" if i % 5 == 0 else "math", kind="ok" if i % 2 else "wrong")
        rows.append(StoredRollout(**{**sr.__dict__, "run_id": run, "round_id": rnd}))
    store.add_rollouts(rows)

    assert [r.rollout.id for r in store.iter_rollouts(chunk_size=7)] == [r.rollout.id for r in rows]
    assert store.count_rollouts() == 250

    def ids(**f):
        got = [r.rollout.id for r in store.iter_rollouts(chunk_size=16, **f)]
        assert len(got) == store.count_rollouts(**f)
        return got

    def expect(pred):
        return [r.rollout.id for r in rows if pred(r)]

    assert ids(run_id=run_a) == expect(lambda r: r.run_id == run_a)
    assert ids(round_index=0) == expect(lambda r: r.round_id in (ra0, rb0))
    assert ids(run_id=run_a, round_index=1) == expect(lambda r: r.round_id == ra1)
    assert ids(domain="code") == expect(lambda r: r.rollout.domain == "code")
    assert ids(kind="wrong", domain="math") == expect(
        lambda r: r.rollout.outcome.kind == "wrong" and r.rollout.domain == "math")
    wanted = [f"r{i:05d}" for i in range(1, 251, 2)] + ["nope"]
    assert ids(ids=wanted) == expect(lambda r: r.rollout.id in wanted)
    assert ids(ids=wanted, run_id=run_b) == expect(lambda r: r.rollout.id in wanted and r.run_id == run_b)
    assert ids(ids=[]) == []
    assert [r.rollout.id for r in store.iter_rollouts(limit=37, chunk_size=10)] == expect(bool)[:37]
    assert [r.rollout.id for r in store.iter_rollouts(ids=wanted, limit=3, chunk_size=2)] == \
        expect(lambda r: r.rollout.id in wanted)[:3]
    assert list(store.iter_rollouts(limit=0)) == []


def test_task_stats_counts_and_task_meta(store: Store) -> None:
    store.upsert_tasks("math", [
        {"task_id": "t1", "split": "train", "level": 2, "prompt": "p", "answer": "a", "meta": {}},
        {"task_id": "t9", "split": "heldout", "level": 5, "prompt": "p", "answer": "a", "meta": {}},
    ])
    store.upsert_tasks("math", [{"task_id": "t1", "split": "train", "level": 3, "prompt": "p2",
                                 "answer": "a", "meta": {"src": "gen"}}])
    run = store.get_or_create_run("r", "math", {})
    rows = [make(1, task="t1"), make(2, task="t1", kind="wrong"), make(3, task="t1"),
            make(4, task="t2", kind="empty"), make(5, task="t1", domain="code")]
    rows[0] = StoredRollout(**{**rows[0].__dict__, "run_id": run})
    store.add_rollouts(rows)
    stats = {s.task_id: s for s in store.task_stats("math")}
    assert set(stats) == {"t1", "t2", "t9"}
    assert (stats["t1"].attempts, stats["t1"].successes) == (3, 2)
    assert dict(stats["t1"].meta) == {"level": 3, "split": "train"}
    assert (stats["t2"].attempts, stats["t2"].successes, dict(stats["t2"].meta)) == (1, 0, {})
    assert (stats["t9"].attempts, stats["t9"].pass_rate) == (0, 0.0)
    [only] = [s for s in store.task_stats("math", run_id=run) if s.attempts]
    assert (only.task_id, only.attempts, only.successes) == ("t1", 1, 1)


def test_jsonl_export_import_export_is_byte_identical(tmp_path: Path, store: Store) -> None:
    run = store.get_or_create_run("r", "math", {})
    rows = [make(i, kind=["ok", "wrong", "truncated", "empty"][i % 4]) for i in range(30)]
    rows.append(make(99, reward=None, advantage=None, kept=None, model_version=None, seed=None,
                     harness_version=None, step=None, reward_components={}))
    rows[0] = StoredRollout(**{**rows[0].__dict__, "run_id": run})
    store.add_rollouts(rows)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with open(first, "w", encoding="utf-8") as f:
        assert export_jsonl(store, f) == 31
    with Store.open(tmp_path / "fresh") as fresh:
        assert import_jsonl(fresh, first).imported == 31
        with open(second, "w", encoding="utf-8") as f:
            export_jsonl(fresh, f)
        got = fresh.get_rollout("r00005")
    assert first.read_bytes() == second.read_bytes()
    # training fields sit in meta.train, the rest is the plain api shape
    line = json.loads(first.read_text(encoding="utf-8").splitlines()[5])
    assert line["meta"]["train"]["seed"] == 1239 and line["outcome"]["kind"] == "wrong"
    assert got == StoredRollout(**{**rows[5].__dict__})


def _write_bad_file(path: Path, good: list[StoredRollout]) -> None:
    from evotrainer.store.jsonl import dumps
    ok = [json.loads(dumps(sr)) for sr in good]
    missing = dict(ok[0], id="m1")
    del missing["task_id"]
    wrong_type = dict(ok[0], id="m2", num_tokens="12")
    bad_kind = dict(ok[0], id="m3", outcome={**ok[0]["outcome"], "kind": "great"})
    bad_train = dict(ok[0], id="m4", meta={"train": {"reward": "high"}})
    lines = [
        json.dumps(ok[0]),            # 1 good
        "{not json",                  # 2
        json.dumps(missing),          # 3
        "",                           # 4 blank: allowed
        json.dumps(wrong_type),       # 5
        json.dumps(bad_kind),         # 6
        json.dumps(ok[1]),            # 7 good
        json.dumps(ok[0]),            # 8 duplicate of line 1
        json.dumps(ok[2]),            # 9 already in the store
        json.dumps(bad_train),        # 10
        json.dumps([1, 2]),           # 11
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_import_reports_every_bad_line_and_stores_nothing(tmp_path: Path, store: Store) -> None:
    good = [make(1), make(2), make(3)]
    store.add_rollouts([good[2]])
    path = tmp_path / "bad.jsonl"
    _write_bad_file(path, good)
    with pytest.raises(ImportErrors) as info:
        import_jsonl(store, path)
    errors = dict(info.value.errors)
    assert sorted(errors) == [2, 3, 5, 6, 8, 9, 10, 11]
    assert "invalid JSON" in errors[2]
    assert "task_id" in errors[3]
    assert "num_tokens" in errors[5]
    assert "outcome kind <value> is not one of" in errors[6] and "great" not in errors[6]  # no file content
    assert "duplicate" in errors[8] and "line 1" in errors[8]
    assert "already in the store" in errors[9]
    assert "meta.train.reward" in errors[10]
    assert "object" in errors[11]
    assert store.count_rollouts() == 1

    summary = import_jsonl(store, path, skip_bad=True)
    assert summary.imported == 2 and [n for n, _ in summary.skipped] == sorted(errors)
    assert {r.rollout.id for r in store.iter_rollouts()} == {"r00001", "r00002", "r00003"}
    assert store.get_rollout("r00001") == good[0]
