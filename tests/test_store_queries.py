"""The Store's named reads (store/replay.py, store/views.py) against real SQLite files, and the
boundary they exist for: no module outside evotrainer/store builds SQL. test_store_postgres.py
runs the read tests again on PostgreSQL."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_store import make

import evotrainer
from evotrainer.store import ImportRefused, RolloutScope, Store, StoredRollout, export_jsonl, import_jsonl


@pytest.fixture
def store(tmp_path: Path) -> Store:
    with Store.open(tmp_path / "work") as s:
        yield s


def _scattered(store: Store, n: int = 24, **fields) -> list[StoredRollout]:
    """n rollouts in groups of 4 (make()), stored interleaved: g0 g1 g0 g1 ... so no group is contiguous."""
    rows = [replace(make(i), **fields) for i in range(n)]
    stored = []
    for g in range(0, n, 8):  # two groups at a time, alternating rows
        a, b = rows[g:g + 4], rows[g + 4:g + 8]
        stored += [r for pair in zip(a, b) for r in pair]
    store.add_rollouts(stored)
    return stored


def test_pin_rounds_a_limit_up_to_the_end_of_its_group(store: Store) -> None:
    stored = _scattered(store)
    seqs = {k[1]: k[0] for k in store.rollout_keys()}
    scope, count = store.pin(RolloutScope())
    assert (scope.until_seq, count) == (store.last_seq(), 24)
    # the first row is g0's: the scope runs on to g0's last row, which takes in most of g1 too
    scope, count = store.pin(RolloutScope(), limit=1)
    g0_end = max(seqs[r.rollout.id] for r in stored if r.rollout.group_id == "g0")
    assert scope.until_seq == g0_end and count == 7
    store.add_rollouts([make(100)])  # pinned: a later rollout is not in the pinned scope
    assert store.pin(scope) == (scope, 7) and store.count_in(scope) == 7
    assert store.pin(RolloutScope(domain="code"), limit=5)[1] == 0


def test_rollout_keys_pages_and_listed_ids_come_in_store_order(store: Store) -> None:
    stored = _scattered(store)
    in_order = [r.rollout.id for r in stored]
    keys = list(store.rollout_keys(page=5))
    assert [k[1] for k in keys] == in_order and [k[0] for k in keys] == sorted(k[0] for k in keys)
    assert [k[2] for k in keys] == [r.rollout.group_id for r in stored]
    assert list(store.rollout_keys(page=5)) == list(store.rollout_keys(page=1000))
    listed = in_order[::-3] + ["not-stored"]
    assert [k[1] for k in store.rollout_keys(ids=listed)] == [i for i in in_order if i in listed]
    until = keys[9][0]
    assert [k[1] for k in store.rollout_keys(RolloutScope(until_seq=until), page=4)] == in_order[:10]


def test_group_rows_reads_each_group_whole_and_once(store: Store) -> None:
    stored = _scattered(store)
    scope, _ = store.pin(RolloutScope())
    cols = ("seq", "id", "group_id", "meta", "turns")
    keys = [k[0] for k in store.rollout_keys(scope)]
    for width in (1, 3, 5, 24):  # every cut of the seqs into ranges
        seen = []
        for i in range(0, len(keys), width):
            rows = store.group_rows(scope, keys[i], keys[min(i + width, len(keys)) - 1], cols, raw_json=True)
            groups = [r[2] for r in rows]
            assert all(groups.count(g) == 4 for g in groups), groups  # whole groups only
            seen += rows
        assert sorted(r[1] for r in seen) == sorted(r.rollout.id for r in stored)  # every row once
    assert [r[0] for r in store.rows_at(keys[::-1][:3], cols)] == sorted(keys[-3:])  # store order
    raw = store.rows_at(keys[:1], cols, raw_json=True)[0]
    assert isinstance(raw[3], str) and json.loads(raw[3]) == stored[0].rollout.meta
    assert store.rows_at(keys[:1], cols)[0][3] == stored[0].rollout.meta  # parsed unless asked raw


def test_views_read_names_labels_and_aggregates(store: Store) -> None:
    b = store.get_or_create_run("b-run", "math", {})
    a = store.get_or_create_run("a-run", "math", {})
    assert list(store.run_names().items()) == [(a, "a-run"), (b, "b-run")]
    r0, r1 = store.start_round(b, 0, "h", "m"), store.start_round(b, 1, "h", "m")
    store.add_rollouts([replace(make(i, kind="ok" if i % 2 else "wrong"), run_id=b, round_id=r0 if i < 8 else r1)
                        for i in range(12)] + [make(50)])
    assert store.round_labels() == {r0: ("b-run", 0), r1: ("b-run", 1)}
    assert [r["run_id"] for r in store.all_rounds()] == [b, b] and store.rounds(a) == []
    counts = {(rid, kind, kept): n for rid, kind, kept, n in store.outcome_counts()}
    assert sum(counts.values()) == 13 and counts[(None, "ok", True)] == 1
    rows = list(store.round_rows(r0, ("seq", "id", "meta"), page=3))
    assert [r["id"] for r in rows] == [f"r{i:05d}" for i in range(8)] and rows[0]["meta"]["level"] == 0
    assert [r["id"] for r in store.round_rows(None, ("seq", "id"))] == ["r00050"]
    stats = {(rid, g): rest for rid, g, *rest in store.group_reward_stats(1e-9)}
    # g0 = r0..r3 (make: reward 1/0, advantage +-0.5, kept unless i % 3 == 0): live = kept ones
    assert stats[(r0, "g0")] == [0.0, 1.0, 4, 2] and len(stats) == 3
    means = store.round_means(b)
    assert means[0] == pytest.approx((0.5, 0.5)) and set(means) == {0, 1}
    store.upsert_tasks("math", [{"task_id": "t1", "split": "heldout", "prompt": "p", "answer": "a"},
                                {"task_id": "t0", "split": "train", "prompt": "q", "answer": "b"}])
    assert store.task_keys("heldout") == {("math", "t1")}
    assert [t["task_id"] for t in store.tasks("math")] == ["t0", "t1"] and store.tasks("code") == []
    assert len(list(store.rollout_tasks(RolloutScope(b, 1)))) == 4
    refs = list(store.rollout_tasks(RolloutScope(), ["r00001", "r00050", "nope"]))
    assert sorted(r[0] for r in refs) == ["r00001", "r00050"] and refs[0][2] == "math"
    assert store.verified_success(["r00001", "r00002", "nope"]) == {"r00001": True, "r00002": False}


def test_long_id_lists_are_read_in_bounded_chunks(store: Store) -> None:
    """More ids than one IN list holds (store/sql.py IN_CHUNK), on every read that takes ids."""
    store.add_rollouts(make(i) for i in range(1300))
    ids = [f"r{i:05d}" for i in range(1300)][::-1] + ["absent"] * 3
    assert store.count_in(RolloutScope(), ids) == 1300
    assert len(store.verified_success(ids)) == 1300 and len(list(store.rollout_tasks(RolloutScope(), ids))) == 1300
    keys = list(store.rollout_keys(ids=ids))
    assert [k[1] for k in keys] == sorted(ids[:1300])
    assert len(store.rows_at([k[0] for k in keys], ("seq", "id"))) == 1300


def test_an_import_the_database_refuses_raises_import_refused(tmp_path: Path, store: Store) -> None:
    """A refusal that is not a duplicate id (here a trigger) rolls the import back whole and says
    why without the SQL or the values."""
    path = tmp_path / "in.jsonl"
    with Store.open(tmp_path / "other") as other:
        other.add_rollouts([make(1), make(2)])
        with open(path, "w", encoding="utf-8") as out:
            export_jsonl(other, out)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TRIGGER no_rollouts BEFORE INSERT ON rollouts "
                             "BEGIN SELECT RAISE(ABORT, 'rollouts are read-only here'); END")
    with pytest.raises(ImportRefused) as info:
        import_jsonl(store, path)
    assert info.value.message == "rollouts are read-only here" and "INSERT" not in str(info.value)
    assert "What is" not in str(info.value) and store.count_rollouts() == 0


STORE_DIR = Path(evotrainer.__file__).parent / "store"


def test_no_module_outside_the_store_builds_sql() -> None:
    """SQL is built in evotrainer/store only: elsewhere no SQLAlchemy import, no import of the
    store's tables or SQL helpers, and no use of a store's engine."""
    bad = []
    for path in sorted(Path(evotrainer.__file__).parent.rglob("*.py")):
        if STORE_DIR in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno}: imports {n}" for n in names
                    if n.split(".")[0] == "sqlalchemy" or n in ("evotrainer.store.models", "evotrainer.store.sql")]
            if isinstance(node, ast.Attribute) and node.attr in ("engine", "_session") \
                    and "store" in ast.unparse(node.value).lower():
                bad.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)
