"""The store, backtests and resume against a real PostgreSQL server (tests/pg_server.py starts a
throwaway one on loopback; without the server packages these tests skip, or fail in CI).

The store tests are the SQLite ones (tests/test_store.py, tests/test_store_queries.py) run again
with a PostgreSQL `store`; the backtest tests compare a PostgreSQL store with a SQLite store
holding the same rollouts.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pg_server import pg_url, postgres  # noqa: F401  (fixtures)
from test_backtest import LENGTH_BONUS, PARTIAL_CREDIT, gate_groups, propose, workspace

# The SQLite store tests, collected here a second time with the `store` fixture below.
from test_store import (  # noqa: F401
    test_add_rollouts_is_atomic_on_duplicate_id,
    test_ambiguous_prefix_and_reserved_meta_key,
    test_import_reports_every_bad_line_and_stores_nothing,
    test_iter_rollouts_filters_chunks_and_limit,
    test_jsonl_export_import_export_is_byte_identical,
    test_rollout_round_trip_keeps_every_field,
    test_runs_rounds_and_evals,
    test_task_stats_counts_and_task_meta,
)
from test_store_queries import (  # noqa: F401
    test_group_rows_reads_each_group_whole_and_once,
    test_long_id_lists_are_read_in_bounded_chunks,
    test_pin_rounds_a_limit_up_to_the_end_of_its_group,
    test_rollout_keys_pages_and_listed_ids_come_in_store_order,
    test_views_read_names_labels_and_aggregates,
)

from evotrainer.backtest import Selector, backtest, replay
from evotrainer.store import Store, StoredRollout


@pytest.fixture
def store(pg_url: str):  # noqa: F811
    with Store(pg_url) as s:
        assert s.engine.dialect.name == "postgresql"
        yield s


def _fill(store: Store) -> None:
    """What test_backtest's `ws` fixture stores: two rounds of gate_groups() under other ids."""
    run = store.get_or_create_run("default", "math", {})
    rounds = [store.start_round(run, i, "seed", "base") for i in range(2)]
    rows = gate_groups(run_id=run, round_id=rounds[0])
    rows += [StoredRollout(rollout=replace(r.rollout, id="r1-" + r.rollout.id, group_id="r1-" + r.rollout.group_id),
                           run_id=run, round_id=rounds[1]) for r in gate_groups()]
    store.add_rollouts(rows)


@pytest.mark.slow
def test_backtests_on_postgres_match_sqlite_and_replay(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    """Same rollouts, same candidates: the reports from PostgreSQL (read by sandboxed workers over
    loopback TCP) equal the SQLite ones, and a replay on PostgreSQL reproduces."""
    reports = {}
    for name, url in (("sqlite", None), ("postgres", pg_url)):
        ws = workspace(tmp_path / name)
        with (Store(url) if url else Store.open(ws.root)) as store:
            _fill(store)
            for slug, reward in (("length-bonus", LENGTH_BONUS), ("partial-credit", PARTIAL_CREDIT)):
                report = backtest(ws.root, propose(ws, slug, reward), store=store, workers=2,
                                  selector=Selector(run="default", round=0))
                reports[name, slug] = report
            if url:
                run_id = store.run_id("default")
                late = [StoredRollout(rollout=replace(r.rollout, id="late-" + r.rollout.id),
                                      run_id=run_id, round_id=store.rounds(run_id)[0]["id"])
                        for r in gate_groups()[:16]]
                store.add_rollouts(late)  # stored after the backtest: must not leak into the replay
                first = reports[name, "partial-credit"]
                again = replay(ws.root, first["id"], store=store, workers=2)
                assert again["reproduced"], again["mismatches"]
                assert store.get_backtest(first["id"])["decision"] == first["decision"]
    for slug, decision in (("length-bonus", "reject"), ("partial-credit", "promote")):
        pg, lite = reports["postgres", slug], reports["sqlite", slug]
        assert pg["metrics"] == lite["metrics"] and pg["n_rollouts"] == 128
        assert pg["rollout_ids_sha256"] == lite["rollout_ids_sha256"]
        assert pg["decision"] == lite["decision"] == decision


@pytest.mark.slow
def test_coevolve_stages_use_the_configured_postgres_store_and_resume(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    """The outer loop with store.url on PostgreSQL: diagnose, propose and backtest read the server
    (backtest used to open <workdir>/store.db whatever the config said); a fresh loop object, as
    after a kill, resumes from the saved state and promotes."""
    from test_coevolve import plain_config, seed_round

    from evotrainer.coevolve import Coevolution, RunState

    config = plain_config(tmp_path)
    config.store.url = pg_url
    config.coevolve.max_proposals = 4  # partial credit, which the gate passes, is the fourth
    workdir = tmp_path / "work"
    loop = Coevolution(config, workdir)
    seed_round(workdir, url=pg_url)[0].close()
    state = RunState(run="tiny", domain="math", stage="diagnose")
    state.save(loop.state_path)
    loop.stage_diagnose(state)
    loop.stage_propose(state)
    loop.stage_backtest(state)
    assert not (workdir / "store.db").exists()  # nothing went to a SQLite file in the workdir
    assert any(c.decision == "promote" for c in state.candidates)
    with Store(pg_url) as store:
        assert {b["id"] for b in store.backtests()} == {c.backtest for c in state.candidates}
    state.stage = "promote"
    state.save(loop.state_path)

    resumed = Coevolution(config, workdir)
    again = RunState.load(resumed.state_path)
    assert [c.backtest for c in again.candidates] == [c.backtest for c in state.candidates]
    resumed.stage_promote(again)
    assert again.pending is not None
    assert resumed.repo.log(first_parent=True)[0].trailers.get("Backtest") == again.pending.backtest


@pytest.mark.slow
def test_training_round_and_resume_on_postgres(tmp_path: Path, pg_url: str, embedded_model_dir) -> None:  # noqa: F811
    """test_train's round-and-resume check with store.url on PostgreSQL (the real embedded model)."""
    from test_train import check_round_and_resume

    check_round_and_resume(tmp_path, [f"store.url={pg_url}"])
    assert not (tmp_path / "store.db").exists()
