"""The `llm` agent's tools mode (propose/llm_tools.py) against a real chat-completions server on
loopback (tests/llm_server.py) that plays scripted tool calls, over a real workspace: seeded
rollouts in a real SQLite store, the real git harness repo, real sandbox workers and the real
backtest engine and gate. Each test asserts the transcript and the named ending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_server import ChatServer
from test_coevolve import plain_config, seed_round  # tests/ is on sys.path

from evotrainer.backtest.gate import targets_from_trailer
from evotrainer.coevolve import Coevolution, RunState
from evotrainer.propose.base import Evidence
from evotrainer.propose.llm_tools import ENDINGS, FINISH, LLMToolAgent
from evotrainer.skills import SkillLibrary
from evotrainer.tools import TOOLS, Transcript, read_submissions, transcript_path

CANDIDATE = {"diagnosis": "six of eight groups are dead", "targets": "dead_group_ratio",
             "expected": "dead_group_ratio falls by at least the margin"}


def call(name: str, arguments: dict | str | None = None) -> dict:
    return {"name": name, "arguments": {} if arguments is None else arguments}


def reply(*calls: dict, content: str | None = None, usage: dict | None = None) -> dict:
    out: dict = {"content": content, "tool_calls": list(calls)}
    if usage:
        out["usage"] = usage
    return out


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server():
    with ChatServer() as chat:
        yield chat


@pytest.fixture
def loop(tmp_path, server) -> Coevolution:
    """A workspace with seed_round's round 0 (6 dead groups of 8) whose config picks the llm agent
    in tools mode at the loopback server."""
    config = plain_config(tmp_path)
    llm = config.coevolve.llm.model_copy(update={"base_url": server.url, "model": "test-model", "max_submissions": 1})
    co = config.coevolve.model_copy(update={"agent": "llm", "llm": llm})
    loop = Coevolution(config.model_copy(update={"coevolve": co}), tmp_path / "work")
    seed_round(loop.ws.root)[0].close()
    return loop


def agent(server: ChatServer, **kw) -> LLMToolAgent:
    return LLMToolAgent(base_url=server.url, model="test-model", api_key="sk-test", endpoint_retries=0, **kw)


def evidence(loop: Coevolution) -> Evidence:
    return Evidence(round_index=0, domain="math", report=None, samples=[], workdir=loop.ws.root, run="tiny")


def transcript(loop: Coevolution) -> list[dict]:
    return Transcript(transcript_path(loop.ws.root, "tiny", 0)).read()


def tool_lines(lines: list[dict]) -> list[dict]:
    return [line for line in lines if "tool" in line]


def tool_replies(request: dict) -> list[dict]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def partial_credit(loop: Coevolution) -> dict[str, str]:
    return SkillLibrary.load(loop.ws.root).get("partial-credit-format").render(loop.repo.sources("main"),
                                                                               {"weight": 0.1})


# ---------------------------------------------------------------- a full round


def test_a_scripted_round_becomes_the_loops_candidate_and_is_promoted(loop, server):
    """list rollouts -> health report -> write -> backtest -> submit -> finish; the loop's own
    backtest and gate then promote the submitted branch."""
    branch = "candidate/0-pcf"
    server.add(reply(call("list_rollouts", {"success": False, "limit": 3}), content="Looking at failures."),
               reply(call("health_report")),
               reply(call("write_candidate", {"slug": "pcf", "edits": partial_credit(loop), **CANDIDATE})),
               reply(call("backtest_candidate", {"branch": branch})),
               reply(call("submit_candidate", {"branch": branch})),
               reply(call(FINISH, {"summary": "partial credit revives the dead groups"})))
    state = RunState(run="tiny", domain="math", stage="diagnose")
    state.save(loop.state_path)
    loop.stage_diagnose(state)
    loop.stage_propose(state)

    [cand] = state.candidates
    assert (cand.branch, cand.slug) == (branch, "pcf")
    # The agent named dead_group_ratio; the targets are the evidence's (diagnose/targets.py): the
    # metrics that judge the alerts it answers, dead_group_ratio among them.
    assert "dead_group_ratio" in targets_from_trailer(cand.targets), cand.targets
    requests = server.completions()
    assert len(requests) == 6 and not server.replies
    first = requests[0]
    assert first["messages"][0]["role"] == "system" and "Nothing you do promotes" in first["messages"][0]["content"]
    assert "dead_group_ratio" in first["messages"][1]["content"]  # the health report's summary
    names = [t["function"]["name"] for t in first["tools"]]
    assert set(names) == {*TOOLS, FINISH}
    # each tool call is answered by a `tool` message with its id, after the assistant's calls
    second = requests[1]["messages"]
    assert second[2]["role"] == "assistant" and second[3]["role"] == "tool"
    assert second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"]
    assert json.loads(second[3]["content"])["result"]["total"] == 62
    backtested = tool_replies(requests[4])[-1]
    assert backtested["ok"] and backtested["result"]["decision"] == "promote", backtested

    lines = transcript(loop)
    assert lines[0]["event"] == "start" and lines[0]["budgets"]["submissions"] == 1
    assert [t["tool"] for t in tool_lines(lines)] == ["list_rollouts", "health_report", "write_candidate",
                                                       "backtest_candidate", "submit_candidate"]
    assert all(t["ok"] for t in tool_lines(lines))
    end = lines[-1]
    assert (end["event"], end["ending"], end["tool_calls"], end["bad_calls"], end["turns"]) == \
        ("end", "finished", 6, 0, 6)
    assert end["submitted"] == [branch] and "partial credit" in end["detail"]
    assert end["tokens"] > 0

    loop.stage_backtest(state)
    assert cand.decision == "promote" and cand.backtest == backtested["result"]["id"]  # the agent's report, reused
    loop.stage_promote(state)
    assert state.pending is not None and state.pending.branch == branch
    assert loop.repo.log(first_parent=True)[0].subject.startswith("Promote")

    # a resumed propose stage takes the submissions as they stand and asks the model nothing
    again = loop._agent()
    [p] = again.propose(evidence(loop), {}, [])
    assert (p.branch, again.last_round.ending) == (branch, "already_submitted") and len(server.completions()) == 6


# ---------------------------------------------------------------- bad calls and failing tools


def test_bad_calls_and_a_failing_tool_are_answered_and_the_loop_goes_on(loop, server):
    server.add(reply(call("promote_candidate", {"branch": "candidate/0-x"}),
                     call("list_rollouts", '{"limit": 3'),
                     call("list_rollouts", {"limit": "ten"}),
                     call("write_candidate", {"slug": "broken", "edits": {"reward.py": "def reward(:\n"},
                                              **CANDIDATE})),
               reply(call("list_rollouts", {"limit": 1})),
               "Nothing more to do.")
    tools = agent(server)
    assert tools.propose(evidence(loop), {}, []) == []
    answered = tool_replies(server.completions()[1])
    assert [a["error"]["kind"] for a in answered] == ["unknown_tool", "bad_arguments", "bad_arguments", "failed"]
    assert "not JSON" in answered[1]["error"]["message"]
    assert "limit" in answered[2]["error"]["message"]
    assert "does not load" in answered[3]["error"]["message"]
    assert tool_replies(server.completions()[2])[-1]["ok"]  # the loop went on

    lines = transcript(loop)
    assert [(t["tool"], t["ok"]) for t in tool_lines(lines)] == [
        ("promote_candidate", False), ("list_rollouts", False), ("list_rollouts", False),
        ("write_candidate", False), ("list_rollouts", True)]
    assert tool_lines(lines)[1]["args"] == '{"limit": 3'  # what the model sent, as it sent it
    end = lines[-1]
    assert (end["ending"], end["bad_calls"], end["tool_calls"], end["turns"]) == ("no_tool_calls", 4, 5, 3)
    assert tools.endings == {"no_tool_calls": 1}
    assert "candidate/0-broken" not in loop.repo.candidates()


# ---------------------------------------------------------------- budgets and the endpoint


def test_the_call_budget_ends_the_round(loop, server):
    server.add(reply(call("list_rollouts", {"limit": 1})),
               reply(call("task_history", {"limit": 1}), call("lineage")),
               reply(call("list_rollouts", {"limit": 1})))
    tools = agent(server, max_calls=2)
    assert tools.propose(evidence(loop), {}, []) == []
    assert len(server.completions()) == 2 and len(server.replies) == 1
    lines = transcript(loop)
    assert [t.get("error", {}).get("kind") for t in tool_lines(lines)] == [None, None, "budget_exhausted"]
    end = lines[-1]
    assert (end["ending"], end["toolbox"]) == ("budget_calls", {"calls": 2, "refused": 1})


def test_the_token_budget_ends_the_round_before_the_calls_it_paid_for(loop, server):
    usage = {"prompt_tokens": 550, "completion_tokens": 50, "total_tokens": 600}
    server.add(reply(call("list_rollouts", {"limit": 1}), usage=usage),
               reply(call("write_candidate", {"slug": "pcf", "edits": partial_credit(loop), **CANDIDATE}), usage=usage))
    tools = agent(server, max_total_tokens=1000)
    assert tools.propose(evidence(loop), {}, []) == []
    lines = transcript(loop)
    assert [t["tool"] for t in tool_lines(lines)] == ["list_rollouts"]
    assert (lines[-1]["ending"], lines[-1]["tokens"]) == ("budget_tokens", 1200)
    assert "candidate/0-pcf" not in loop.repo.candidates()


def test_the_time_budget_ends_the_round(loop, server):
    tools = agent(server, max_seconds=1e-9)
    assert tools.propose(evidence(loop), {}, []) == []
    assert server.completions() == [] and transcript(loop)[-1]["ending"] == "budget_time"


def test_an_endpoint_error_ends_the_round_cleanly(loop, server):
    server.add(reply(call("list_rollouts", {"limit": 1})), {"status": 500, "message": "the model crashed"})
    tools = agent(server)
    assert tools.propose(evidence(loop), {}, []) == []
    end = transcript(loop)[-1]
    assert (end["ending"], end["turns"], end["tool_calls"]) == ("endpoint_error", 1, 1)
    assert "500" in end["detail"] and "the model crashed" in end["detail"]
    assert tools.last_round is not None and tools.last_round.ending in ENDINGS
    assert read_submissions(loop.ws.root, "tiny", 0) == []


def test_the_loop_survives_an_endpoint_error_with_no_candidate(loop, server):
    server.add({"status": 500, "message": "down"})
    state = RunState(run="tiny", domain="math", stage="diagnose")
    state.save(loop.state_path)
    loop.stage_diagnose(state)
    loop.stage_propose(state)
    assert state.candidates == [] and transcript(loop)[-1]["ending"] == "endpoint_error"


def test_config_picks_the_mode(tmp_path):
    from evotrainer.propose.llm import LLMAgent

    config = plain_config(tmp_path)
    assert config.coevolve.llm.mode == "tools"
    llm = config.coevolve.llm.model_copy(update={"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    for mode, cls in (("tools", LLMToolAgent), ("oneshot", LLMAgent)):
        co = config.coevolve.model_copy(update={"agent": "llm", "llm": llm.model_copy(update={"mode": mode})})
        loop = Coevolution(config.model_copy(update={"coevolve": co}), Path(tmp_path) / "work")
        assert isinstance(loop._agent(), cls)


# ---------------------------------------------------------------- the harness-fault benchmark


def test_bench_runs_a_case_with_the_tools_mode_in_one_command(tmp_path, server):
    """`evotrainer bench harness CASE --agent llm --base-url URL --model M` (tools mode, the
    default): the model's submitted candidate is what the benchmark gates, promotes and judges,
    and the JSON reports the agent's tool calls, tokens and ending per case."""
    from typer.testing import CliRunner

    from evotrainer.cli.main import app
    from evotrainer.paths import FAULT_CASES_DIR

    spec = (FAULT_CASES_DIR / "math-length-pays" / "harness" / "harness.yaml").read_text()
    assert "  thorough: 2.0\n" in spec
    fix = {"slug": "drop-length-pay", "edits": {"harness.yaml": spec.replace("  thorough: 2.0\n", "  thorough: 0.0\n")},
           "diagnosis": "thorough pays 2.0 per full-length completion", "targets": "ordering_violations",
           "expected": "ordering_violations falls to about 0"}
    server.add(reply(call("read_harness_file", {"name": "harness.yaml"})),
               reply(call("write_candidate", fix)),
               reply(call("submit_candidate", {"branch": "candidate/0-drop-length-pay"}), call(FINISH)))
    out = tmp_path / "scores.json"
    res = CliRunner().invoke(app, ["bench", "harness", "math-length-pays", "--agent", "llm", "--base-url", server.url,
                                   "--model", "test-model", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    [case] = data["cases"]
    assert data["agent"] == "llm-tools" and case["promoted"] == "candidate/0-drop-length-pay", case["tried"]
    assert case["repaired"] and case["safe"], (case["criteria"], case["unsafe"])
    assert (case["agent_loop"]["ending"], case["agent_loop"]["tool_calls"]) == ("finished", 4)
    assert data["overall"]["tool_calls"] == 4 and data["overall"]["endings"] == {"finished": 1}
