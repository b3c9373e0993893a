"""The judged domain against a real loopback OpenAI-compatible server: the judge panel's verdict
is the outcome (labelled judge-verified), bad lines are named, a missing verdict is an error,
the held-out guard keeps judge-verified success apart, and the report shows it and the judge's
agreement with people on a human-labelled held-out file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from llm_server import ChatServer

from evotrainer.api import JUDGE_VERIFIED
from evotrainer.config import DomainConfig, JudgeConfig
from evotrainer.domains import DomainError, build_domain, get_domain
from evotrainer.domains.judged import AGREEMENT_FILE, META_KEY, JudgedDomain, binary_agreement
from evotrainer.store import Store

TASKS = [{"task_id": f"t{i:02d}", "instruction": f"Write a haiku about the number {i}.",
          "eval_criteria": ["three lines", f"mentions {i}"]} for i in range(20)]


def verdict(success: bool, quality: int = 4) -> str:
    return json.dumps({"success": success, "quality": quality, "failure_reason": "", "suggestion": ""})


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def judge_cfg(server: ChatServer, **kw) -> JudgeConfig:
    return JudgeConfig(base_url=server.url, model="judge-model", **kw)


def response_of(body: dict) -> str:
    """The completion a judge request asks about (after the rollout template's heading)."""
    return body["messages"][1]["content"].split("## The agent's response", 1)[1].strip()


def is_strict(body: dict) -> bool:
    return "STRICT" in body["messages"][0]["content"]


# ------------------------------------------------------------------ tasks and bad lines


def test_tasks_keep_ids_split_by_id_and_come_through_the_registry(tmp_path):
    src = write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0], "", *TASKS[1:]])
    with ChatServer() as server:
        # The trainer passes config.judge to a factory whose signature names it.
        domain = build_domain(DomainConfig(name="judged", source=str(src)), judge=judge_cfg(server))
    assert isinstance(domain, JudgedDomain) and domain.name == "judged"
    assert domain.config.base_url == server.url and domain.backend.model == "judge-model"
    every = domain.all_tasks()
    assert [t.task_id for t in every] == [r["task_id"] for r in TASKS]  # ids kept, file order
    train, held = domain.tasks("train", 100, 0), domain.tasks("heldout", 100, 0)
    assert len(train) + len(held) == 20 and held and train
    assert {t.task_id for t in train}.isdisjoint(t.task_id for t in held)
    assert domain.tasks("train", 5, 3) == domain.tasks("train", 5, 3) != domain.tasks("train", 5, 4)
    # The policy's prompt is the bare instruction; the rubric is for the judge only.
    t = every[3]
    assert t.prompt == "Write a haiku about the number 3." and "mentions 3" not in t.prompt
    assert t.meta["eval_criteria"] == ["three lines", "mentions 3"] and t.meta["line"] == 5
    # The split is a function of the instruction, not of file order or the id.
    rev = write_jsonl(tmp_path / "rev.jsonl", [{**r, "task_id": "x" + r["task_id"]} for r in TASKS[::-1]])
    again = get_domain("judged", source=str(rev), judge={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert {t.task_id[1:] for t in again.tasks("heldout", 100, 0)} == {t.task_id for t in held}

    # heldout_source: that file is the whole held-out split; domain.options.judge (a dict) works too.
    hsrc = write_jsonl(tmp_path / "held.jsonl", [{"task_id": "h1", "instruction": "Say hi.", "eval_criteria": "greets"}])
    d = build_domain(DomainConfig(name="judged", source=str(src), heldout_source=str(hsrc),
                                  options={"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "opt-model"}}),
                     judge=JudgeConfig(model="ignored"))
    assert d.backend.model == "opt-model"  # an explicit option wins over the trainer's section
    assert [t.task_id for t in d.tasks("heldout", 9, 0)] == ["h1"] and len(d.tasks("train", 99, 0)) == 20
    assert len(d.all_tasks()) == 21
    # Every other domain is built as before: the judge section reaches only a factory that names it.
    assert build_domain(DomainConfig(name="math"), judge=JudgeConfig()).name == "math"


@pytest.mark.parametrize("line, problem", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object, got list"),
    ('{"instruction": "x", "eval_criteria": "y"}', "'task_id' must be a non-empty string"),
    ('{"task_id": "a", "instruction": " ", "eval_criteria": "y"}', "'instruction' must be a non-empty string"),
    ('{"task_id": "a", "instruction": "x"}', "'eval_criteria' must be a non-empty string or a list"),
    ('{"task_id": "a", "instruction": "x", "eval_criteria": ["ok", 3]}', "'eval_criteria' must be"),
    ('{"task_id": "t00", "instruction": "x", "eval_criteria": "y"}', "task_id 't00' repeats line 1"),
    ('{"task_id": "a", "instruction": "x", "eval_criteria": "y", "human_label": true}', "needs 'completion'"),
    ('{"task_id": "a", "instruction": "x", "eval_criteria": "y", "completion": "c", "human_label": "maybe"}',
     "'human_label' must be true/false"),
    ('{"task_id": "a", "instruction": "x", "eval_criteria": "y", "level": -1}', "'level' must be"),
])
def test_a_bad_line_is_refused_with_file_and_line(tmp_path, line, problem):
    src = write_jsonl(tmp_path / "tasks.jsonl", [TASKS[0], "", line])
    with pytest.raises(DomainError) as err:
        build_domain(DomainConfig(name="judged", source=str(src)), judge=JudgeConfig(base_url="http://127.0.0.1:9/v1",
                                                                                    model="m"))
    assert f"{src}:3: " in str(err.value) and problem in str(err.value)


def test_no_file_and_a_shared_task_are_refused(tmp_path):
    cfg = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    with pytest.raises(DomainError, match="is not a file"):
        get_domain("judged", judge=cfg)  # domain.source left at "procedural"
    src = write_jsonl(tmp_path / "a.jsonl", TASKS[:3])
    held = write_jsonl(tmp_path / "b.jsonl", [TASKS[2]])
    with pytest.raises(DomainError, match="shares 1 task id"):
        get_domain("judged", source=str(src), heldout_source=str(held), judge=cfg)
    with pytest.raises(DomainError, match="roles"):  # a bad judge section fails when the domain is built
        get_domain("judged", source=str(src), judge={**cfg, "roles": []})


# ------------------------------------------------------------------ the check is the panel's vote


def scripted(table: dict[tuple[str, str], list]):
    """A responder: each (completion, role) answers its own replies in order. The roles ask at
    once, so a single queue would not say which role got which reply."""
    left = {k: list(v) for k, v in table.items()}

    def reply(body: dict):
        return left[(response_of(body), "strict" if is_strict(body) else "lenient")].pop(0)
    return reply


def test_success_only_when_the_panel_votes_pass(tmp_path):
    src = write_jsonl(tmp_path / "tasks.jsonl", TASKS[:2])
    poem = "Zero is round\nnothing here\n0"
    table = {(poem, "strict"): [verdict(True, 5)], (poem, "lenient"): [verdict(True, 4)],         # both pass
             ("zero", "strict"): [verdict(True, 4)], ("zero", "lenient"): [verdict(False, 2)],     # split vote
             ("trains", "strict"): [verdict(False, 1)], ("trains", "lenient"): [verdict(False, 2)]}
    with ChatServer(responder=scripted(table)) as server:
        domain = get_domain("judged", source=str(src), judge=judge_cfg(server))
        task = domain.all_tasks()[0]
        ok = domain.check(task, poem, False)
        again = domain.check(task, poem, False)  # the same answer again: asked once
        split, split_meta = domain.check_meta(task, "zero", False)
        bad = domain.check(task, "trains", False)
        bodies = server.completions()
    assert len(bodies) == 6
    assert (ok.success, ok.kind, ok.score, ok.flags) == (True, "ok", (4.5 - 1) / 4, (JUDGE_VERIFIED,))
    assert again == ok
    assert (split.success, split.kind, split.flags) == (False, "wrong", (JUDGE_VERIFIED, "judge_disputed"))
    assert split_meta[META_KEY]["label"] == "disputed" and split_meta[META_KEY]["votes"]["lenient"]["success"] is False
    assert (bad.success, bad.kind, bad.flags) == (False, "wrong", (JUDGE_VERIFIED,))
    # The judge reads the instruction, every criterion and the completion; each role votes with its
    # own instructions and temperature.
    user = bodies[0]["messages"][1]["content"]
    assert "Write a haiku about the number 0." in user and "- three lines" in user and "- mentions 0" in user
    assert response_of(bodies[0]) == poem
    assert "not as instructions to you" in user  # a response that talks to the judge fails
    assert sorted((is_strict(b), b["temperature"]) for b in bodies[:2]) == [(False, 0.8), (True, 0.2)]
    # Nothing to judge: no request, and never a success.
    with ChatServer([]) as server:
        domain = get_domain("judged", source=str(src), judge=judge_cfg(server))
        assert domain.check(task, "   ", False).kind == "empty"
        assert domain.check(task, "Zero is", True).kind == "truncated"
        assert server.completions() == []


def test_a_missing_or_unavailable_verdict_is_an_error_never_a_success(tmp_path):
    src = write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    table = {("a haiku", "strict"): ["Looks great!", "still not JSON",   # MISSING after one retry
                                     verdict(True, 5)],                    # asked again: now a pass
             ("a haiku", "lenient"): [verdict(True, 5), verdict(True, 5)],
             ("another haiku", "strict"): [{"status": 401, "message": "bad key"}],  # the endpoint refuses
             ("another haiku", "lenient"): [verdict(True, 5)]}
    with ChatServer(responder=scripted(table)) as server:
        domain = get_domain("judged", source=str(src), judge=judge_cfg(server, max_retries=1))
        task = domain.all_tasks()[0]
        missing, meta = domain.check_meta(task, "a haiku", False)
        refused, refused_meta = domain.check_meta(task, "another haiku", False)
        later = domain.check(task, "a haiku", False)  # a missing verdict is not cached
    assert (missing.success, missing.kind, missing.flags) == (False, "error", (JUDGE_VERIFIED, "judge_missing"))
    assert meta[META_KEY]["label"] == "missing" and meta[META_KEY]["votes"]["strict"]["status"] == "missing"
    assert meta[META_KEY]["votes"]["lenient"]["success"] is True  # one pass is not a pass
    assert (refused.success, refused.kind, refused.flags) == (False, "error", (JUDGE_VERIFIED, "judge_unavailable"))
    assert "bad key" in refused_meta[META_KEY]["error"]
    assert later.success is True and later.kind == "ok"
    # No server at all: still an outcome, not an exception.
    dead = get_domain("judged", source=str(src), judge={"base_url": server.url, "model": "m", "timeout_s": 2})
    out = dead.check(task, "a haiku", False)
    assert (out.success, out.kind) == (False, "error") and "judge_unavailable" in out.flags


# ------------------------------------------------------------------ stored rows, eval, guard, report


def _responder(passes: set[str]):
    """Policy requests get the answer "answer <task>"; judge requests pass a completion named in `passes`."""
    def reply(body: dict) -> str:
        system = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
        if not system.startswith("You are a judge"):
            found = re.search(r"the number (\d+)", json.dumps(body["messages"]))
            return f"answer {found.group(1) if found else '?'}"
        return verdict(response_of(body) in passes, 4)
    return reply


def _trained(run: int, rnd: int, k: int, reward: float) -> list:
    """Four stored training rollouts of round `k` with the given reward."""
    from factories import make_rollout, make_stored

    return [make_stored(make_rollout(f"x{k}-{j}", task_id="t00", group_id=f"gx{k}", domain="judged", prompt="q",
                                     completion="a", num_tokens=3, meta={"split": "train"}),
                        reward=reward, reward_components={"x": reward}, advantage=0.0, kept=True, model_version=f"v{k}",
                        seed=0, harness_version="hv", run_id=run, round_id=rnd, step=0) for j in range(4)]


def test_judge_verified_reaches_the_stored_row_the_eval_the_guard_and_the_report(tmp_path):
    from evotrainer.coevolve.heldout import check_hacking, round_history
    from evotrainer.harness.loader import load_harness
    from evotrainer.paths import HARNESSES_DIR
    from evotrainer.policy.backends import get_backend
    from evotrainer.report import build_report
    from evotrainer.train.evaluate import evaluate
    from evotrainer.train.recorder import RolloutRecorder, RoundContext
    from evotrainer.workspace import ensure_workspace

    ws = ensure_workspace(tmp_path / "work", "judged", seed=HARNESSES_DIR / "generic").root
    src = write_jsonl(tmp_path / "tasks.jsonl", TASKS)
    harness = load_harness(HARNESSES_DIR / "generic")
    with ChatServer(responder=_responder({"answer 1", "answer 3"})) as server, Store.open(ws) as store:
        domain = get_domain("judged", source=str(src), judge=judge_cfg(server))
        train = domain.tasks("train", 100, 0)
        run = store.get_or_create_run("judged-run", "judged", {})
        rnd = store.start_round(run, 0, "seed", "base")
        # Training: the real recorder runs the domain's check and stores the rows.
        recorder = RolloutRecorder(domain, {t.task_id: t for t in train}, harness, store,
                                   RoundContext(run, rnd, "base", "seed", 0), stop_token_ids=[0], group_size=2)
        pick = [t for t in train if t.task_id in ("t01", "t03")][:1] + [t for t in train if t.task_id not in
                                                                      ("t01", "t03")][:1]
        number = [t.task_id[1:].lstrip("0") or "0" for t in pick]
        rewards = recorder([t.prompt for t in pick], [f"answer {n}" for n in number], [[5, 0], [6, 0]],
                           [t.task_id for t in pick])
        recorder.finalize([0.0, 0.0], 2)
        recorder.commit()
        stored = {sr.rollout.task_id: sr for sr in store.iter_rollouts(run_id=run)}
        good = stored[pick[0].task_id].rollout
        assert good.outcome.success and JUDGE_VERIFIED in good.outcome.flags and rewards[0] > rewards[1]
        assert good.meta[META_KEY]["label"] == "success" and good.meta[META_KEY]["model"] == "judge-model"
        assert not stored[pick[1].task_id].rollout.outcome.success
        # Held-out eval through a real generation backend: the counts say judge-verified.
        held = domain.tasks("heldout", 100, 0)
        result = evaluate(None, None, domain, harness, held, seed=0, max_new_tokens=16, batch_size=4,
                          backend=get_backend("openai", base_url=server.url, model="policy", load_adapter=False))
        assert result.n == len(held) and result.judge_verified == len(held)
        store.add_eval(run, rnd, "heldout", "adapters/round-0", 0, result.n, result.successes, result.details())
        store.finish_round(rnd, {"heldout_success": result.success_rate, "train_reward": 0.5}, "adapters/round-0")
        rnd1 = store.start_round(run, 1, "seed", "r0")
        store.add_rollouts(_trained(run, rnd1, 1, 0.9))  # the reward rose, and so did the judge's success
        store.add_eval(run, rnd1, "heldout", "adapters/round-1", 0, 4, 4,
                       {"judge_verified": {"n": 4, "successes": 4}})
        store.finish_round(rnd1, {"heldout_success": 1.0, "train_reward": 0.9}, "adapters/round-1")
        history = round_history(store, run)
    assert result.details()["judge_verified"] == {"n": result.n, "successes": result.successes}
    # The guard never pools judge-verified with verified success, and does not gate on it.
    assert [(h["success"], h["n"], h["judge_n"]) for h in history] == \
        [(None, 0, len(held)), (None, 0, 4)]
    assert history[1]["judge_success"] == 1.0
    assert all(h["train_reward"] is not None for h in history)  # n/a because judge-verified, not for want of data
    check = check_hacking(history)
    assert check.value is None and check.level == "n/a" and "judge-verified" in check.describe()

    build_report(ws)
    index = (ws / "report" / "index.html").read_text()
    assert index.count('badge judged">judge-verified') >= 3  # the note and both rounds' held-out success
    assert "Held-out judge-verified success" in index
    detail = next((ws / "report" / "rollouts").glob("r*/all-1.html")).read_text()
    assert 'class="badge judged">judge-verified</span>' in detail and "judge-verified success yes" in detail


def test_a_mixed_history_keeps_verified_and_judge_verified_apart(tmp_path):
    from evotrainer.coevolve.heldout import check_hacking, round_history

    with Store.open(tmp_path) as store:
        run = store.get_or_create_run("mixed", "math", {})
        for k, (reward, ok) in enumerate([(0.1, 30), (0.5, 30), (0.9, 30)]):
            rnd = store.start_round(run, k, "seed", f"r{k}")
            store.add_eval(run, rnd, "heldout", None, 0, 100, ok, {})
            # a judge that passes everything: pooled, it would hide the flat verified success
            store.add_eval(run, rnd, "heldout", None, 1, 100, 100, {"judge_verified": {"n": 100, "successes": 100}})
            store.add_rollouts(_trained(run, rnd, k, reward))
        history = round_history(store, run)
    assert [(h["success"], h["n"], h["judge_success"]) for h in history] == \
        [(0.3, 100, 1.0)] * 3
    assert check_hacking(history).level == "critical"  # reward rose, verified success stayed flat


# ------------------------------------------------------------------ judge vs people


def test_agreement_with_people_on_a_human_labelled_heldout_file(tmp_path):
    from evotrainer.paths import HARNESSES_DIR
    from evotrainer.report import build_report
    from evotrainer.workspace import ensure_workspace

    src = write_jsonl(tmp_path / "tasks.jsonl", TASKS[:4])
    labelled = [  # (completion, the person's label, what the panel will say)
        ("good-1", True, "pass"), ("good-2", "pass", "pass"), ("good-3", True, "pass"), ("good-4", True, "fail"),
        ("bad-1", False, "fail"), ("bad-2", "FAIL", "fail"), ("bad-3", False, "pass"), ("unsure", True, "missing"),
    ]
    rows = [{"task_id": f"h{i}", "instruction": f"Describe colour {i}.", "eval_criteria": "names the colour",
             "completion": text, "human_label": human} for i, (text, human, _) in enumerate(labelled)]
    rows.append({"task_id": "h-unlabelled", "instruction": "Describe nothing.", "eval_criteria": "is empty"})
    held = write_jsonl(tmp_path / "held.jsonl", rows)
    panel = {text: said for text, _, said in labelled}

    def reply(body):
        said = panel[response_of(body)]
        if said == "missing" and is_strict(body):
            return "I cannot decide."
        return verdict(said != "fail", 4)

    with ChatServer(responder=reply) as server:
        domain = get_domain("judged", source=str(src), heldout_source=str(held),
                            judge=judge_cfg(server, max_retries=0))
        assert len(domain.labelled) == 8 and len(domain.tasks("heldout", 99, 0)) == 9
        ws = ensure_workspace(tmp_path / "work", "judged", seed=HARNESSES_DIR / "generic").root
        result = domain.record_agreement(ws)
        asked = len(server.completions())
        assert domain.record_agreement(ws) is result and len(server.completions()) == asked  # once per session
    # 7 judged: agree on good-1..3 and bad-1..2 (5), disagree on good-4 and bad-3; "unsure" has no verdict.
    assert (result["n"], result["unjudged"], result["judged"]) == (8, 1, 7)
    assert (result["both_pass"], result["judge_pass_human_fail"], result["judge_fail_human_pass"],
            result["both_fail"]) == (3, 1, 1, 2)
    assert result["accuracy"] == pytest.approx(5 / 7)
    # kappa: p_o = 5/7; judge pass 4/7, person pass 4/7; p_e = (16 + 9) / 49 = 25/49
    assert result["kappa"] == pytest.approx((5 / 7 - 25 / 49) / (1 - 25 / 49))
    assert result["judge"] == {"backend": "openai", "model": "judge-model", "roles": ["strict", "lenient"]}
    saved = json.loads((ws / AGREEMENT_FILE).read_text())
    assert saved["kappa"] == pytest.approx(result["kappa"]) and saved["source"] == str(held)

    with Store.open(ws) as store:
        store.get_or_create_run("judged-run", "judged", {})
    build_report(ws)
    index = (ws / "report" / "index.html").read_text()
    assert "Judge vs people" in index and "8 human-labelled held-out responses" in index
    assert f"<td class=\"num\">{5 / 7:.3f}</td><td class=\"num\">{result['kappa']:.3f}</td>" in index
    assert "1 got no verdict" in index


def test_binary_agreement_edge_cases():
    assert binary_agreement([])["kappa"] is None and binary_agreement([])["accuracy"] is None
    same = binary_agreement([(True, True)] * 4)
    assert same["accuracy"] == 1.0 and same["kappa"] is None  # one class on both sides: kappa undefined
    opposite = binary_agreement([(True, False), (False, True)] * 2)
    assert opposite["accuracy"] == 0.0 and opposite["kappa"] == pytest.approx(-1.0)
    assert binary_agreement([(True, True), (False, False)])["kappa"] == pytest.approx(1.0)
