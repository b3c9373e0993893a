"""The agent tool surface (evotrainer/tools/) on a real workspace: a real SQLite store with seeded
rounds, the real git harness repo, real sandbox workers, the real backtest engine and gate.
Each forbidden attempt of the trust boundary is its own test that makes the attempt."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from factories import make_rollout, make_stored
from test_coevolve import plain_config, seed_round  # tests/ is on sys.path

from evotrainer.api import Turn
from evotrainer.coevolve import Coevolution
from evotrainer.coevolve.loop import FAILURE_PROBE
from evotrainer.coevolve.probes import failure_reward_probe
from evotrainer.skills import SkillLibrary
from evotrainer.tools import TOOLS, Toolbox, read_submissions, transcript_path
from evotrainer.tools.registry import check_schema

SECRET = "SECRET-ANSWER-4"


def _row(rid, task, group, run_id, round_id, *, success=False, meta=None, turns=()):
    r = make_rollout(rid, task_id=task, group_id=group, completion="" if turns else "Answer: 4", turns=turns,
                     success=success, num_tokens=30, meta=meta or {"level": 0})
    return make_stored(r, reward=float(success), advantage=0.0, kept=True, model_version="base", seed=0,
                       harness_version="seed", run_id=run_id, round_id=round_id, step=1)


@pytest.fixture
def work(tmp_path) -> Path:
    """Round 0: seed_round (64 rollouts, 6 dead groups). Round 1: one visible multi-turn rollout
    whose meta holds the task's answer, one of a held-out task (task table) and one of a
    validation task (its meta)."""
    loop = Coevolution(plain_config(tmp_path), tmp_path / "work")
    store, run_id, _ = seed_round(loop.ws.root)
    store.upsert_tasks("math", [{"task_id": "t-held", "split": "heldout", "prompt": "held?", "answer": "42"}])
    round1 = store.start_round(run_id, 1, "seed", "base")
    turns = [Turn("system", "You solve sums."), Turn("user", "What is 2 + 2?"), Turn("assistant", "It is 4.")]
    store.add_rollouts([
        _row("m0001", "t-multi", "gm", run_id, round1, success=True, turns=turns,
             meta={"level": 0, "answer": SECRET}),
        _row("h0001", "t-held", "gh", run_id, round1, meta={"level": 0}),
        _row("v0001", "t-val", "gv", run_id, round1, meta={"level": 0, "split": "validation"}),
    ])
    store.close()
    return loop.ws.root


def tools(work: Path, round_index: int = 0, **kw) -> Toolbox:
    return Toolbox(work, "tiny", round_index, **kw)


def ok(out):
    assert out["ok"], out
    return out["result"]


def err(out, kind):
    assert not out["ok"] and out["error"]["kind"] == kind, out
    return out["error"]["message"]


def counts(work: Path) -> dict[str, int]:
    with sqlite3.connect(work / "store.db") as db:
        return {t: db.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("runs", "rounds", "tasks", "rollouts", "evals")}


def partial_credit(tb: Toolbox) -> dict[str, str]:
    return SkillLibrary.load(tb.ws.root).get("partial-credit-format").render(tb.repo.sources("main"), {"weight": 0.1})


CANDIDATE = {"diagnosis": "six of eight groups are dead", "targets": "dead_group_ratio",
             "expected": "dead_group_ratio falls by at least the margin"}

# ---------------------------------------------------------------- the registry


def test_every_tool_has_a_name_description_and_schema():
    assert len(TOOLS) >= 15
    for name, t in TOOLS.items():
        assert t.name == name and t.description and "\n" not in t.description and t.group in ("read", "analyse", "act")
        check_schema(t.schema, name)
        spec = json.loads(json.dumps(t.spec()))
        assert spec["function"]["parameters"]["type"] == "object"
    assert not [n for n in TOOLS if any(w in n for w in ("promote", "merge", "revert", "write_store"))]


# ---------------------------------------------------------------- read tools


def test_list_rollouts_filters_and_pages(work):
    with tools(work) as tb:
        page = ok(tb.call("list_rollouts", {"limit": 10}))
        assert (page["total"], len(page["rollouts"]), page["next_offset"]) == (64, 10, 10)
        last = ok(tb.call("list_rollouts", {"offset": 60, "limit": 10}))
        assert len(last["rollouts"]) == 4 and last["next_offset"] is None
        assert {r["id"] for r in page["rollouts"]}.isdisjoint(r["id"] for r in last["rollouts"])
        assert ok(tb.call("list_rollouts", {"success": True}))["total"] == 2
        assert ok(tb.call("list_rollouts", {"kind": "truncated", "limit": 100}))["total"] == 30
        assert ok(tb.call("list_rollouts", {"min_reward": 0.5}))["total"] == 2
        assert ok(tb.call("list_rollouts", {"max_reward": 0.5}))["total"] == 62
        assert ok(tb.call("list_rollouts", {"kept": False}))["total"] == 0
        assert ok(tb.call("list_rollouts", {"task_id": "t-g7"}))["total"] == 8
        found = ok(tb.call("list_rollouts", {"text": "let me THINK", "limit": 100}))
        assert found["total"] == 30 and all("think" in r["preview"].lower() for r in found["rollouts"])
        everything = ok(tb.call("list_rollouts", {"all_rounds": True, "limit": 100}))
        ids = {r["id"] for r in everything["rollouts"]}
        assert everything["total"] == 65 and "m0001" in ids and not ids & {"h0001", "v0001"}
        assert ok(tb.call("list_rollouts", {"round": 1}))["total"] == 1
        err(tb.call("list_rollouts", {"round": 7}), "not_found")


def test_show_rollout_has_every_message_and_no_answer(work):
    with tools(work) as tb:
        shown = ok(tb.call("show_rollout", {"id": "m0001"}))
        assert [m["role"] for m in shown["messages"]] == ["system", "user", "assistant"]
        assert shown["messages"][2]["content"] == "It is 4." and shown["round"] == 1
        assert "answer" not in shown["meta"] and SECRET not in json.dumps(shown)
        assert ok(tb.call("show_rollout", {"id": "r0063"}))["prompt"] == "What is 2 + 2?"
        err(tb.call("show_rollout", {"id": "r00"}), "bad_arguments")  # ambiguous prefix
        err(tb.call("show_rollout", {"id": "nope"}), "not_found")


def test_task_history_per_round(work):
    with tools(work) as tb:
        hist = ok(tb.call("task_history", {"limit": 100}))
        assert hist["total"] == 9 and {"t-held", "t-val"}.isdisjoint(t["task_id"] for t in hist["tasks"])
        g7 = ok(tb.call("task_history", {"task_id": "t-g7"}))["tasks"][0]
        assert (g7["attempts"], g7["successes"], g7["rounds"]) == (8, 1, [{"round": 0, "attempts": 8, "successes": 1}])
        paged = ok(tb.call("task_history", {"limit": 4, "offset": 4}))
        assert len(paged["tasks"]) == 4 and paged["next_offset"] == 8


def test_health_report_and_run_probe(work):
    with tools(work) as tb:
        report = ok(tb.call("health_report", {}))
        dead = next(p for p in report["probes"] if p["name"] == "dead_group_ratio")
        assert dead["level"] == "critical" and report["n_rollouts"] == 64 and "dead_group_ratio" in report["alerts"]
        probe = ok(tb.call("run_probe", {"name": "dead_group_ratio"}))
        assert probe["value"] == pytest.approx(0.75) and probe["level"] == "critical"
        assert probe["examples"] and all(not e["success"] for e in probe["examples"])
        err(tb.call("run_probe", {"name": "no_such_probe"}), "not_found")


def test_skills_lineage_and_harness_files(work):
    with tools(work) as tb:
        skills = ok(tb.call("list_skills", {"domain": "math"}))["skills"]
        assert "partial-credit-format" in {s["name"] for s in skills}
        skill = ok(tb.call("show_skill", {"name": "partial-credit-format"}))
        assert skill["templates"] and skill["validation"]
        err(tb.call("show_skill", {"name": "nope"}), "not_found")
        line = ok(tb.call("lineage", {}))
        assert line["main"] == tb.repo.resolve("main") and line["commits"][0]["subject"].startswith("Seed harness")
        files = ok(tb.call("list_harness_files", {}))["files"]
        assert "reward.py" in files
        assert "def reward" in ok(tb.call("read_harness_file", {"name": "reward.py"}))["text"]
        err(tb.call("read_harness_file", {"name": "reward.py", "rev": "no-such-branch"}), "not_found")


def test_bad_arguments_are_named_error_results(work):
    with tools(work) as tb:
        assert "limit must be <= 100" in err(tb.call("list_rollouts", {"limit": 1000}), "bad_arguments")
        assert "success must be a boolean" in err(tb.call("list_rollouts", {"success": "yes"}), "bad_arguments")
        assert "unknown argument 'colour'" in err(tb.call("list_rollouts", {"colour": 1}), "bad_arguments")
        assert "missing required argument 'id'" in err(tb.call("show_rollout", {}), "bad_arguments")
        assert "must be one of" in err(tb.call("list_rollouts", {"kind": "great"}), "bad_arguments")
        err(tb.call("list_rollouts", "not an object"), "bad_arguments")
        err(tb.call("drop_tables", {}), "unknown_tool")
        assert tb.calls == 7


# ---------------------------------------------------------------- analysis in the sandbox

TRUNCATED_SHARE = "def analyse(rollouts, rewards):\n    return sum(r.truncated for r in rollouts) / len(rollouts)\n"


def test_analysis_runs_sandboxed_with_examples(work):
    with tools(work) as tb:
        out = ok(tb.call("run_analysis", {"code": TRUNCATED_SHARE}))
        assert out["value"] == pytest.approx(30 / 64) and out["passes_threshold"]
        assert out["examples"] and all(e["truncated"] for e in out["examples"])
        # the analysis sees no answer: this would count every rollout that carries one
        peek = "def analyse(rollouts, rewards):\n    return float(sum('answer' in r.meta for r in rollouts))\n"
        assert ok(tb.call("run_analysis", {"code": peek, "round": 1}))["value"] == 0.0
        err(tb.call("run_analysis", {"code": "x = 1\n"}), "failed")  # no analyse()


@pytest.mark.parametrize("attempt", ["read_store", "read_harness_repo", "socket", "sqlite", "write_outside"])
def test_analysis_that_escapes_fails_in_the_sandbox(work, tmp_path, attempt):
    outside = tmp_path / "escaped.txt"
    body = {
        "read_store": f"    return float(len(open({str(work / 'store.db')!r}, 'rb').read()))",
        "read_harness_repo": f"    return float(len(open({str(work / 'harnesses' / 'reward.py')!r}).read()))",
        "socket": "    import socket\n    socket.create_connection(('127.0.0.1', 9)); return 1.0",
        "sqlite": f"    import sqlite3\n    return float(len(sqlite3.connect({str(work / 'store.db')!r}).execute("
                  "'select * from tasks').fetchall()))",
        "write_outside": f"    open({str(outside)!r}, 'w').write('out'); return 1.0",
    }[attempt]
    with tools(work) as tb:
        message = err(tb.call("run_analysis", {"code": f"def analyse(rollouts, rewards):\n{body}\n"}), "failed")
    why = {"read_store": "No such file", "read_harness_repo": "No such file", "socket": "import of 'socket'",
           "sqlite": "import of 'sqlite3'", "write_outside": "for writing"}[attempt]
    assert "analysis failed in the sandbox" in message and why in message, message
    assert not outside.exists()


# ---------------------------------------------------------------- acting


def test_write_backtest_revise_submit(work):
    with tools(work, max_submissions=1) as tb:
        main = tb.repo.resolve("main")
        cand = ok(tb.call("write_candidate", {"slug": "pcf", "edits": partial_credit(tb), **CANDIDATE}))
        assert cand["branch"] == "candidate/0-pcf" and "reward.py" in cand["files"]
        head = tb.repo.log(rev="refs/heads/candidate/0-pcf", limit=1)[0]
        assert head.trailers["Targets"] == "dead_group_ratio" and head.trailers["Diagnosis"]
        bt = ok(tb.call("backtest_candidate", {"branch": "candidate/0-pcf"}))
        assert bt["decision"] == "promote" and bt["target"] == "dead_group_ratio" and bt["reasons"]
        assert bt["deltas"]["dead_group_ratio"] < 0
        listed = ok(tb.call("list_backtests", {}))["backtests"]
        assert listed[0]["id"] == bt["id"]
        assert ok(tb.call("show_backtest", {"id": bt["id"]}))["decision"] == "promote"
        reward = tb.repo.sources("candidate/0-pcf")["reward.py"]
        revised = ok(tb.call("revise_candidate", {"branch": "candidate/0-pcf", "slug": "pcf-note",
                                                  "edits": {"reward.py": reward + "\n# revised\n"}, **CANDIDATE}))
        assert revised["base"] == tb.repo.resolve("candidate/0-pcf")
        err(tb.call("write_candidate", {"slug": "Bad Slug", "edits": {"reward.py": "x"}, **CANDIDATE}),
            "bad_arguments")
        # a harness that does not load never becomes a branch
        err(tb.call("write_candidate", {"slug": "broken", "edits": {"reward.py": "def reward(:\n"}, **CANDIDATE}),
            "failed")
        assert "candidate/0-broken" not in tb.repo.candidates()
        assert ok(tb.call("submit_candidate", {"branch": "candidate/0-pcf"}))["remaining"] == 0
        err(tb.call("submit_candidate", {"branch": "candidate/0-pcf-note"}), "submit_limit")
        assert tb.repo.resolve("main") == main  # submitting is not promoting
    subs = read_submissions(work, "tiny", 0)
    assert [s["branch"] for s in subs] == ["candidate/0-pcf"] and subs[0]["backtest"] == bt["id"]


def test_budget_exhaustion_is_counted(work):
    with tools(work, max_calls=3) as tb:
        for _ in range(3):
            ok(tb.call("list_skills", {}))
        out = tb.call("list_skills", {})
        err(out, "budget_exhausted")
        err(tb.call("show_rollout", {"id": "r0001"}), "budget_exhausted")
        assert out["calls"] == {"used": 3, "max": 3, "refused": 1} and tb.refused_calls == 2
    lines = [json.loads(x) for x in transcript_path(work, "tiny", 0).read_text().splitlines()]
    assert [x["ok"] for x in lines] == [True, True, True, False, False]
    assert lines[-1]["error"]["kind"] == "budget_exhausted"


def test_transcript_holds_every_call_as_it_goes(work):
    path = transcript_path(work, "tiny", 0)
    with tools(work) as tb:
        ok(tb.call("list_rollouts", {"limit": 2}))
        assert len(path.read_text().splitlines()) == 1  # on disk before the next call
        err(tb.call("show_rollout", {"id": "h0001"}), "refused")
        err(tb.call("run_analysis", {"code": TRUNCATED_SHARE + "#" * 30_000}), "bad_arguments")  # too long
        ok(tb.call("lineage", {"limit": 100}))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["tool"] for x in lines] == ["list_rollouts", "show_rollout", "run_analysis", "lineage"]
    assert [x["seq"] for x in lines] == [1, 2, 3, 4]
    assert lines[0]["args"] == {"limit": 2} and len(lines[0]["result"]["rollouts"]) == 2
    assert lines[1]["error"]["kind"] == "refused"
    assert lines[2]["ok"] is False and lines[2]["args"]["truncated"] and lines[2]["args"]["chars"] > 30_000
    assert all("elapsed_s" in x and "time" in x for x in lines)


# ---------------------------------------------------------------- the trust boundary, one attempt each


def test_no_tool_promotes_or_merges(work):
    with tools(work) as tb:
        main = tb.repo.resolve("main")
        ok(tb.call("write_candidate", {"slug": "pcf", "edits": partial_credit(tb), **CANDIDATE}))
        for name in ("promote", "merge", "promote_candidate", "git"):
            err(tb.call(name, {"branch": "candidate/0-pcf"}), "unknown_tool")
        err(tb.call("backtest_candidate", {"branch": "main"}), "refused")
        err(tb.call("revise_candidate", {"branch": "main", "slug": "x", "edits": {"reward.py": "x"}, **CANDIDATE}),
            "refused")
        ok(tb.call("submit_candidate", {"branch": "candidate/0-pcf"}))
        assert tb.repo.resolve("main") == main
        assert not [c for c in tb.repo.log(first_parent=True) if c.is_merge]


def test_no_tool_writes_the_store(work):
    before = counts(work)
    with tools(work) as tb:
        for name, args in [("list_rollouts", {"all_rounds": True}), ("show_rollout", {"id": "m0001"}),
                           ("task_history", {}), ("health_report", {}), ("lineage", {}), ("list_skills", {}),
                           ("run_probe", {"name": "success_rate"}), ("run_analysis", {"code": TRUNCATED_SHARE}),
                           ("list_backtests", {})]:
            ok(tb.call(name, args))
        err(tb.call("add_rollouts", {"rows": []}), "unknown_tool")
    assert counts(work) == before


def test_path_traversal_is_refused(work):
    with tools(work) as tb:
        for name in ("../store.db", "../harness-refs.json", "sub/../reward.py"):
            assert "refused" in err(tb.call("write_candidate", {"slug": "escape", "edits": {name: "x = 1\n"},
                                                                **CANDIDATE}), "refused")
            err(tb.call("read_harness_file", {"name": name}), "refused")
        assert not [b for b in tb.repo.candidates() if "escape" in b]


def test_absolute_paths_are_refused(work):
    with tools(work) as tb:
        for name in (str(work / "store.db"), "/etc/passwd"):
            err(tb.call("write_candidate", {"slug": "abs", "edits": {name: "x = 1\n"}, **CANDIDATE}), "refused")
            err(tb.call("read_harness_file", {"name": name}), "refused")
        assert "candidate/0-abs" not in tb.repo.candidates()


def test_symlinked_file_names_are_refused(work):
    (work / "harnesses" / "evil.py").symlink_to(work / "store.db")
    with tools(work) as tb:
        assert "symlink" in err(tb.call("write_candidate", {"slug": "link", "edits": {"evil.py": "x = 1\n"},
                                                            **CANDIDATE}), "refused")
        assert "symlink" in err(tb.call("read_harness_file", {"name": "evil.py"}), "refused")
        assert "candidate/0-link" not in tb.repo.candidates()


def test_git_and_hidden_files_are_refused(work):
    with tools(work) as tb:
        for name in (".git/config", ".gitattributes", ".git", "harness-refs.json"):
            err(tb.call("write_candidate", {"slug": "git", "edits": {name: "[core]\n"}, **CANDIDATE}), "refused")
        assert "candidate/0-git" not in tb.repo.candidates()


def test_the_trusted_probe_cannot_be_edited(work):
    with tools(work) as tb:
        # What the loop does after a revert (coevolve/loop.py, _revise_diagnostics): trusted code.
        sources = tb.repo.sources("main")["diagnostics.py"]
        cand = tb.repo.propose(0, "probe-failure-reward-mean",
                               {"diagnostics.py": sources + "\n\n" + failure_reward_probe(FAILURE_PROBE)},
                               diagnosis="d", targets="diagnostics", expected="e")
        tb.repo.promote(cand.branch, "diagnostics revision after a live contradiction", tested=cand.sha)
        message = err(tb.call("write_candidate", {"slug": "drop-probe", "edits": {"diagnostics.py": sources},
                                                  **CANDIDATE}), "refused")
        assert FAILURE_PROBE in message and "candidate/0-drop-probe" not in tb.repo.candidates()
        kept = tb.repo.sources("main")["diagnostics.py"] + "\n# a note\n"
        ok(tb.call("write_candidate", {"slug": "keep-probe", "edits": {"diagnostics.py": kept}, **CANDIDATE}))


def test_heldout_and_validation_rollouts_are_never_returned(work):
    with tools(work, round_index=1) as tb:
        for rid in ("h0001", "v0001"):
            assert "held-out or validation" in err(tb.call("show_rollout", {"id": rid}), "refused")
        # A prefix is refused without echoing the hidden rollout's full id (issue 32).
        refused = err(tb.call("show_rollout", {"id": "h00"}), "refused")
        assert "held-out or validation" in refused and "h0001" not in refused
        listed = ok(tb.call("list_rollouts", {"limit": 100}))
        assert [r["id"] for r in listed["rollouts"]] == ["m0001"]
        assert ok(tb.call("list_rollouts", {"task_id": "t-held"}))["total"] == 0
        for task in ("t-held", "t-val"):
            err(tb.call("task_history", {"task_id": task}), "refused")
        sees = "def analyse(rollouts, rewards):\n    return float(len(rollouts))\n"
        assert ok(tb.call("run_analysis", {"code": sees}))["value"] == 1.0
        everything = json.dumps([tb.call("list_rollouts", {"all_rounds": True, "limit": 100}),
                                 tb.call("show_rollout", {"id": "m0001"}), tb.call("task_history", {"limit": 100})])
        assert "h0001" not in everything and "v0001" not in everything and SECRET not in everything


def test_no_backtest_over_a_round_with_heldout_rollouts(work):
    with tools(work, round_index=1) as tb:
        edits = {"reward.py": tb.repo.sources("main")["reward.py"] + "\n# note\n"}
        ok(tb.call("write_candidate", {"slug": "note", "edits": edits, **CANDIDATE}))
        assert "held-out" in err(tb.call("backtest_candidate", {"branch": "candidate/1-note"}), "refused")


@pytest.mark.parametrize("frame", [b'["done", 1]', b'["error", "our code broke"]', b'["ready", [{}, {}]]'])
def test_a_candidate_that_writes_frames_while_loading_is_a_failed_write_not_a_crash(work, frame):
    """Issue 32: harness code writing a well-formed frame of the wrong kind on its worker socket
    while the propose stage loads it made the parent raise SandboxError, which stopped the stage."""
    with tools(work) as tb:
        reward = tb.repo.sources("main")["reward.py"] + f'''

import random
import struct

for _f in random._os.listdir("/proc/self/fd"):
    try:
        if random._os.readlink("/proc/self/fd/" + _f).startswith("socket:"):
            random._os.write(int(_f), struct.pack("!i", {len(frame)}) + {frame!r})
    except OSError:
        pass
'''
        why = err(tb.call("write_candidate", {"slug": "frames", "edits": {"reward.py": reward}, **CANDIDATE}),
                  "failed")
        assert "does not load" in why and "candidate/0-frames" not in tb.repo.candidates()
