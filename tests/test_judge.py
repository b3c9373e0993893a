"""Judges against a real loopback OpenAI-compatible server: voting, review queue, cache, malformed
replies, step labels, and judge agreement in a real backtest."""

import json
from pathlib import Path

import pytest
import typer
from factories import make_rollout
from llm_server import ChatServer
from typer.testing import CliRunner

from evotrainer.api import Turn
from evotrainer.cli.judge import judge_cmd
from evotrainer.cli.review import review_cmd
from evotrainer.config import JudgeConfig, JudgeRoleConfig
from evotrainer.judge import JudgePanel, JudgeRecords, StepJudge, make_backend
from evotrainer.store import Store, StoredRollout

app = typer.Typer()  # the two commands as `evotrainer` registers them
app.command("judge")(judge_cmd)
app.command("review")(review_cmd)
ENV = {"COLUMNS": "200", "EVOTRAINER_WORKDIR": None, "EVOTRAINER_STORE_URL": None, "OPENAI_BASE_URL": None,
       "EVOTRAINER_JUDGE_BASE_URL": None, "EVOTRAINER_LLM_BASE_URL": None}


def verdict(success, quality, reason="", suggestion=""):
    return json.dumps({"success": success, "quality": quality, "failure_reason": reason, "suggestion": suggestion})


def rollout(rid, ok=False, group="g0", turns=()):
    return make_rollout(rid, group_id=group, prompt=f"What is 2+{rid[-1]}?", completion=f"Answer: {rid}", turns=turns,
                        success=ok, num_tokens=5, meta={"level": 0})


def make_store(tmp_path: Path, rollouts) -> Store:
    store = Store.open(tmp_path)
    run = store.get_or_create_run("default", "math", {})
    rnd = store.start_round(run, 0, "seed", "base")
    store.add_rollouts([StoredRollout(rollout=r, run_id=run, round_id=rnd, reward=0.0) for r in rollouts])
    return store


def panel_for(server: ChatServer, store: Store | None, **cfg) -> JudgePanel:
    config = JudgeConfig(base_url=server.url, model="judge-model", **cfg)
    return JudgePanel.from_config(config, make_backend(config), JudgeRecords(store) if store else None)


def test_agreeing_roles_label_the_rollout_and_harness_reads_it_from_meta(tmp_path):
    store = make_store(tmp_path, [rollout("r1", ok=True)])
    with ChatServer([verdict(True, 5), verdict(True, 4)]) as server:
        result = panel_for(server, store).judge(store.get_rollout("r1").rollout)
        bodies = server.completions()
    assert result.label == "success" and result.success is True and result.quality == 4.5
    # Each role asks with its own temperature and instructions; the verified outcome is not shown.
    assert [b["temperature"] for b in bodies] == [0.2, 0.8]
    assert "STRICT" in bodies[0]["messages"][0]["content"] and "LENIENT" in bodies[1]["messages"][0]["content"]
    assert all("wrong" not in m["content"] and "ok" != m["content"] for b in bodies for m in b["messages"])
    meta = store.get_rollout("r1").rollout.meta["judge"]
    assert meta["label"] == "success" and meta["success"] is True and meta["source"] == "vote"
    assert meta["votes"]["strict"]["quality"] == 5 and meta["model"] == "judge-model"
    assert JudgeRecords(store).reviews("pending") == []


def test_disagreement_queues_for_review_and_review_cli_labels_it(tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    store = make_store(tmp_path, [rollout("r1"), rollout("r2", ok=True), rollout("r3")])
    with ChatServer([verdict(True, 4), verdict(False, 2, "wrong sum"),   # r1: disputed
                     verdict(False, 2), verdict(True, 3),                   # r2: disputed
                     verdict(False, 1), verdict(False, 2)]) as server:      # r3: agreed failure
        panel = panel_for(server, store)
        labels = [panel.judge(store.get_rollout(rid).rollout).label for rid in ("r1", "r2", "r3")]
    assert labels == ["disputed", "disputed", "failure"]
    records = JudgeRecords(store)
    queue = records.reviews("pending")
    assert [q.rollout_id for q in queue] == ["r1", "r2"] and queue[0].reason == "disagreement"
    assert queue[0].votes["lenient"]["failure_reason"] == "wrong sum"
    assert store.get_rollout("r1").rollout.meta["judge"]["success"] is None  # disputed: no label yet

    runner = CliRunner()
    listed = runner.invoke(app, ["review", "-w", str(tmp_path), "--list"])
    assert listed.exit_code == 0 and "r1" in listed.stdout and "2 pending" in listed.stdout
    # r1: failure with no quality; r2: a bad choice is asked again, then success with quality 4
    res = runner.invoke(app, ["review", "-w", str(tmp_path)], input="f\n\nx\ns\n9\n4\n")
    assert res.exit_code == 0, (res.output, res.exc_info)
    assert "labelled 2; 0 still pending" in res.stdout
    assert "quality is a whole number" in res.output
    r1, r2 = (store.get_rollout(rid).rollout.meta["judge"] for rid in ("r1", "r2"))
    assert (r1["label"], r1["success"], r1["source"]) == ("failure", False, "human")
    assert (r2["label"], r2["success"], r2["quality"], r2["source"]) == ("success", True, 4, "human")
    assert records.human_labels() == {"r1": False, "r2": True}
    # Judging again hits the cache (no request) and keeps the person's label.
    with ChatServer([]) as server:
        again = panel_for(server, store).judge(store.get_rollout("r2").rollout)
        assert server.completions() == []
    assert again.label == "success" and again.source == "human"
    store.close()


def test_verdict_cache_second_call_makes_no_request(tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    store = make_store(tmp_path, [rollout("r1", ok=True), rollout("r2")])
    store.close()
    with ChatServer([verdict(True, 5), verdict(True, 4), verdict(False, 1), verdict(False, 2)]) as server:
        args = ["judge", "-w", str(tmp_path), "--json", f"judge.base_url={server.url}", "judge.model=judge-model"]
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        assert len(server.completions()) == 4
        second = CliRunner().invoke(app, args)
        assert second.exit_code == 0, second.output
        assert len(server.completions()) == 4  # every verdict came from the store
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert (one["success"], one["failure"], one["votes_asked"], one["votes_cached"]) == (1, 1, 4, 0)
    assert (two["success"], two["failure"], two["votes_asked"], two["votes_cached"]) == (1, 1, 0, 4)
    # A changed role prompt is a different prompt hash: asked again.
    with Store.open(tmp_path) as store, ChatServer([verdict(True, 5)]) as server:
        config = JudgeConfig(base_url=server.url, model="judge-model",
                             roles=[JudgeRoleConfig(name="careful", temperature=0.2)])
        JudgePanel.from_config(config, make_backend(config), JudgeRecords(store)).judge(
            store.get_rollout("r1").rollout)
        assert len(server.completions()) == 1


def test_malformed_reply_is_retried_then_missing_never_a_pass(tmp_path):
    store = make_store(tmp_path, [rollout("r1")])
    replies = ["Looks correct to me!",                            # not JSON
               json.dumps({"success": "yes", "quality": 5}),       # a string is not a bool
               json.dumps({"success": True, "quality": 9}),        # quality out of range
               verdict(True, 5)]                                   # lenient: a valid pass
    with ChatServer(replies) as server:
        result = panel_for(server, store, max_retries=2).judge(store.get_rollout("r1").rollout)
        bodies = server.completions()
    assert len(bodies) == 4
    strict = result.votes["strict"]
    assert strict.status == "missing" and strict.verdict is None and strict.attempts == 3
    assert "quality" in strict.error
    # Each retry carries the previous reply and what was wrong with it.
    retry = bodies[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": "Looks correct to me!"}
    assert "not a JSON object" in retry[-1]["content"]
    assert "success: Input should be a valid boolean" in bodies[2]["messages"][-1]["content"]
    # One valid pass does not make a label: the missing vote could have been the dissent.
    assert result.label == "missing" and result.success is None
    meta = store.get_rollout("r1").rollout.meta["judge"]
    assert meta["label"] == "missing" and meta["success"] is None
    assert meta["votes"]["strict"] == {"status": "missing", "error": strict.error}
    rows = {v.role: v for v in JudgeRecords(store).verdicts(["r1"])}
    assert rows["strict"].status == "missing" and rows["strict"].verdict is None
    # A missing verdict is not a cache hit: the next run asks again (and may get an answer).
    with ChatServer([verdict(False, 2)]) as server:
        again = panel_for(server, store).judge(store.get_rollout("r1").rollout)
        assert len(server.completions()) == 1
    assert again.label == "disputed"
    store.close()


def test_step_judge_labels_each_assistant_step_and_caches(tmp_path):
    turns = (Turn("system", "tools"), Turn("user", "fix the bug"), Turn("assistant", '{"tool": "view", "path": "a.py"}'),
             Turn("user", "1 def f(): return 1"), Turn("assistant", '{"tool": "search", "pattern": "zzz"}'),
             Turn("user", "no match"), Turn("assistant", '{"tool": "submit"}'))
    store = make_store(tmp_path, [rollout("r1", turns=turns)])
    r = store.get_rollout("r1").rollout
    with ChatServer(['{"labels": ["GOOD", "BAD"]}', '{"labels": ["GOOD", "bad", "GOOD"]}']) as server:
        config = JudgeConfig(base_url=server.url, model="judge-model")
        judge = StepJudge(make_backend(config), records=JudgeRecords(store), max_retries=1)
        labels = judge(r)
        body = server.completions()[0]["messages"][1]["content"]
        assert "### Step 3" in body and "no match" in body and "not solved" in body
        assert "2 labels for 3 steps" in server.completions()[1]["messages"][-1]["content"]
        assert judge(r) == labels and len(server.completions()) == 2  # cached
    assert labels == ["GOOD", "BAD", "GOOD"]
    assert store.get_rollout("r1").rollout.meta["step_labels"] == labels
    store.close()


def test_judge_agreement_in_backtest(tmp_path):
    from evotrainer.backtest import backtest
    from evotrainer.workspace import ensure_workspace

    ws = ensure_workspace(tmp_path / "work", "math")
    wins = [rollout(f"w{i}", ok=True, group=f"g{i}") for i in range(2)]
    losses = [rollout(f"l{i}", ok=False, group=f"g{i}") for i in range(2)]
    store = make_store(ws.root, [wins[0], losses[0], wins[1], losses[1]])
    # strict qualities: wins 5, 4; losses 4, 1 -> AUC = (1 + 1 + 0.5 + 1) / 4 = 0.875
    # strict success: w0 T, l0 T (wrong), w1 T, l1 F -> accuracy 3/4
    # lenient says success for all four -> accuracy 2/4; qualities all 3 -> AUC 0.5
    script = {"w0": (5, True), "l0": (4, True), "w1": (4, True), "l1": (1, False)}
    with ChatServer() as server:
        panel = panel_for(server, store)
        for rid in ("w0", "l0", "w1", "l1"):
            q, ok = script[rid]
            server.add(verdict(ok, q), verdict(True, 3))
            panel.judge(store.get_rollout(rid).rollout)
    JudgeRecords(store).label("l1", success=True)  # a person disagrees with the verified outcome here
    report = backtest(ws.root, "main", store=store, workers=1)
    store.close()
    strict, lenient = report["judges"]["strict@judge-model"], report["judges"]["lenient@judge-model"]
    assert (strict["n"], strict["auc"], strict["accuracy"], strict["missing_rate"]) == (4, 0.875, 0.75, 0.0)
    assert (lenient["auc"], lenient["accuracy"]) == (0.5, 0.5)
    # l1: strict said failure, lenient success, the person success
    assert (strict["human_n"], strict["human_accuracy"], lenient["human_accuracy"]) == (1, 0.0, 1.0)
    md = (ws.backtests / f"{report['id']}.md").read_text()
    assert "| strict@judge-model | 4 | 0.0000 | 0.8750 | 0.7500 | 1 | 0.0000 |" in md


def test_judge_drift_probe_fires_when_judges_contradict_outcomes():
    from evotrainer.harness.loader import load_harness
    from evotrainer.paths import HARNESSES_DIR

    h = load_harness(HARNESSES_DIR / "math")
    probe = next(p for p in h.probes if p.name == "judge_drift")

    def batch(wrong: int, n: int = 10):
        return [make_rollout(f"r{i}", task_id="t", prompt="q", completion="a", success=i % 2 == 0, score=0.0,
                             num_tokens=1, meta={"judge": {"success": (i % 2 == 0) != (i < wrong)}}) for i in range(n)]

    assert probe.level(probe.evaluate(batch(1), [0.0] * 10)) == "ok"          # 0.1
    assert probe.level(probe.evaluate(batch(3), [0.0] * 10)) == "warn"        # 0.3
    assert probe.level(probe.evaluate(batch(5), [0.0] * 10)) == "critical"    # 0.5
    assert probe.evaluate(batch(5)[:7], [0.0] * 7) is None                    # too few labelled


@pytest.mark.slow
def test_the_local_hf_judge_runs_the_embedded_model_and_never_counts_a_bad_reply_as_a_pass(
        tmp_path, embedded_model_dir):
    """judge.backend=hf with the embedded 135M model: each role's prompt goes through the chat
    template and generate; whatever the small model writes is validated like a server's reply,
    so a verdict is either a valid one or recorded as missing (never a silent pass)."""
    from evotrainer.judge.backends import HFBackend

    store = make_store(tmp_path, [rollout("r1", ok=True)])
    config = JudgeConfig(backend="hf", model="embedded", max_tokens=48, max_retries=1)
    backend = make_backend(config)
    assert isinstance(backend, HFBackend) and backend.model == "hf:embedded"
    reply = backend.complete([{"role": "user", "content": 'Reply with the JSON {"ok": true}.'}], 0.0, 16)
    assert isinstance(reply, str) and reply.strip()  # the model answered something
    panel = JudgePanel.from_config(config, backend, JudgeRecords(store))
    result = panel.judge(store.get_rollout("r1").rollout)
    for vote in result.votes.values():
        assert vote.status in ("ok", "missing") and vote.attempts <= 2
        assert (vote.verdict is None) == (vote.status == "missing")
    if result.label in ("success", "failure"):  # the roles agreed on valid verdicts
        assert all(v.status == "ok" for v in result.votes.values())
    else:
        assert result.success is None
    rows = JudgeRecords(store).verdicts(["r1"])
    assert {r.role for r in rows} == set(result.votes) and all(r.model == "hf:embedded" for r in rows)
    store.close()
