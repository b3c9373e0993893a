"""`evotrainer mcp` and `coevolve --agent external` on a real workspace: the MCP SDK's own client
(ClientSession over stdio_client) starts `python -m evotrainer mcp` as a subprocess over a
seeded store, the real git harness repo and real sandbox workers, drives a round, and the
loop's external-agent stage takes the submission to its own backtest and gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from test_agent_tools import CANDIDATE, _row  # tests/ is on sys.path
from test_coevolve import plain_config, seed_round

from evotrainer.backtest.gate import targets_from_trailer
from evotrainer.coevolve import Coevolution, RunState
from evotrainer.propose.external import playbook_path, session_path
from evotrainer.skills import SkillLibrary
from evotrainer.tools import TOOLS, Toolbox, read_done, read_submissions, transcript_path

ROOT = Path(__file__).resolve().parents[1]


def make_loop(tmp_path: Path, **external: Any) -> Coevolution:
    """The tiny plain config (tests/test_coevolve.py) with the external agent; round 0 seeded
    (6 dead groups), round 1 holds one rollout of a held-out task."""
    cfg = plain_config(tmp_path)
    cfg.coevolve.agent = "external"
    for key, value in {"timeout_s": 90.0, "poll_s": 0.1, **external}.items():
        setattr(cfg.coevolve.external, key, value)
    loop = Coevolution(cfg, tmp_path / "work")
    store, run_id, _ = seed_round(loop.ws.root)
    store.upsert_tasks("math", [{"task_id": "t-held", "split": "heldout", "prompt": "held?", "answer": "42"}])
    round1 = store.start_round(run_id, 1, "seed", "base")
    store.add_rollouts([_row("h0001", "t-held", "gh", run_id, round1)])
    store.close()
    return loop


def at_propose(loop: Coevolution) -> RunState:
    state = RunState(run="tiny", domain="math", stage="diagnose")
    state.save(loop.state_path)
    loop.stage_diagnose(state)
    state.advance("propose", loop.state_path)
    return state


def over_mcp(workdir: Path, drive: Callable[[ClientSession], Any], *extra: str) -> Any:
    """Start `python -m evotrainer mcp --workdir W` and run `drive(session)` against it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    params = StdioServerParameters(command=sys.executable, args=["-m", "evotrainer", "mcp", "--workdir",
                                                                 str(workdir), *extra], env=env, cwd=str(ROOT))

    async def main() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await drive(session)

    return anyio.run(main)


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(isError, the Toolbox's answer) of one call."""
    result = await session.call_tool(name, args)
    [block] = result.content
    return result.isError, json.loads(block.text)


async def ok(session: ClientSession, name: str, args: dict[str, Any]) -> Any:
    is_error, answer = await call(session, name, args)
    assert not is_error and answer["ok"], answer
    return answer["result"]


async def err(session: ClientSession, name: str, args: dict[str, Any], kind: str) -> str:
    is_error, answer = await call(session, name, args)
    assert is_error and not answer["ok"] and answer["error"]["kind"] == kind, answer
    return answer["error"]["message"]


def partial_credit(loop: Coevolution) -> dict[str, str]:
    return SkillLibrary.load(loop.ws.root).get("partial-credit-format").render(loop.repo.sources("main"),
                                                                                 {"weight": 0.1})


def test_an_external_agent_drives_a_round_and_the_gate_promotes_it(tmp_path):
    loop = make_loop(tmp_path)
    state = at_propose(loop)
    main_before = loop.repo.resolve("main")
    waiting = threading.Thread(target=loop.stage_propose, args=(state,))
    waiting.start()  # the loop waits for the agent, as `coevolve --agent external` does
    deadline = time.monotonic() + 30
    while not (session_path(loop.ws.root, "tiny", 0).is_file() and playbook_path(loop.ws.root).is_file()):
        assert time.monotonic() < deadline and waiting.is_alive()
        time.sleep(0.05)
    playbook = playbook_path(loop.ws.root).read_text()
    assert "round 0 of run `tiny`" in playbook and "evotrainer mcp --workdir" in playbook
    assert "finish_round" in playbook and "dead_group_ratio" in playbook  # the tools, the alerts
    edits = partial_credit(loop)

    async def drive(session: ClientSession) -> dict[str, Any]:
        listed = (await session.list_tools()).tools
        assert [t.name for t in listed] == list(TOOLS)
        for t in listed:
            assert t.description == TOOLS[t.name].description and t.inputSchema == dict(TOOLS[t.name].schema)
        page = await ok(session, "list_rollouts", {"success": False, "limit": 5})
        assert page["total"] == 62 and len(page["rollouts"]) == 5
        shown = await ok(session, "show_rollout", {"id": page["rollouts"][0]["id"]})
        assert shown["outcome"]["success"] is False
        health = await ok(session, "health_report", {})
        assert "dead_group_ratio" in json.dumps(health)
        cand = await ok(session, "write_candidate", {"slug": "pcf", "edits": edits, **CANDIDATE})
        assert cand["branch"] == "candidate/0-pcf"
        bt = await ok(session, "backtest_candidate", {"branch": "candidate/0-pcf"})
        assert bt["decision"] == "promote"
        assert (await ok(session, "submit_candidate", {"branch": "candidate/0-pcf"}))["remaining"] == 0
        done = await ok(session, "finish_round", {"note": "dead groups; partial credit rescues them"})
        assert done == {"finished": True, "submitted": ["candidate/0-pcf"]}
        return bt

    bt = over_mcp(loop.ws.root, drive)
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    assert loop.repo.resolve("main") == main_before  # the agent promoted nothing
    assert [c.branch for c in state.candidates] == ["candidate/0-pcf"]
    # the targets are the evidence's (diagnose/targets.py), the agent's own among them
    assert CANDIDATE["targets"] in targets_from_trailer(state.candidates[0].targets)
    assert state.candidates[0].backtest is None
    # The one submission reaches the limit: the loop may stop waiting then, or on finish_round.
    assert state.agent["outcome"] in ("finished", "submit_limit") and state.agent["taken"] == ["candidate/0-pcf"]
    assert RunState.load(loop.state_path).agent == state.agent  # saved: a resumed round keeps it
    loop.stage_backtest(state)  # the gate's own backtest, not the agent's
    [c] = state.candidates
    assert c.decision == "promote" and c.backtest is not None
    loop.stage_promote(state)
    assert state.pending.branch == "candidate/0-pcf" and loop.repo.resolve("main") != main_before
    assert "Promote" in loop.repo.log(first_parent=True)[0].subject
    calls = [json.loads(line)["tool"] for line in transcript_path(loop.ws.root, "tiny", 0).read_text().splitlines()]
    assert calls == ["list_rollouts", "show_rollout", "health_report", "write_candidate", "backtest_candidate",
                     "submit_candidate", "finish_round"]
    assert bt["id"] in {e.name.removesuffix(".json") for e in loop.ws.backtests.iterdir()}


def test_forbidden_and_bad_calls_are_error_results_and_the_server_survives(tmp_path):
    loop = make_loop(tmp_path)
    at_propose(loop)  # no session file: the loop has not reached the wait; budgets from flags

    async def drive(session: ClientSession) -> None:
        assert "refused" in await err(session, "read_harness_file", {"name": "../store.db"}, "refused")
        await err(session, "read_harness_file", {"name": str(loop.ws.root / "store.db")}, "refused")
        await err(session, "write_candidate", {"slug": "escape", "edits": {"../../escaped.py": "x = 1\n"},
                                               **CANDIDATE}, "refused")
        held = await err(session, "show_rollout", {"id": "h0001"}, "refused")
        assert "held-out" in held
        await err(session, "list_rollouts", {"limit": "ten"}, "bad_arguments")
        await err(session, "list_rollouts", {"no_such_argument": 1}, "bad_arguments")
        await err(session, "write_candidate", {"slug": "x"}, "bad_arguments")
        await err(session, "promote_candidate", {"branch": "candidate/0-pcf"}, "unknown_tool")
        await err(session, "run_analysis", {"code": "def analyse(rollouts, rewards):\n    raise RuntimeError('boom')\n"},
                  "failed")
        await err(session, "backtest_candidate", {"branch": "main"}, "refused")
        # still serving, with the budget counting every call above and the five refusals among them
        _, answer = await call(session, "list_rollouts", {"limit": 1})
        assert answer["ok"] and answer["calls"] == {"used": 11, "max": 20, "refused": 5}

    over_mcp(loop.ws.root, drive, "--max-calls", "20")
    assert not (tmp_path / "escaped.py").exists() and not (loop.ws.root / "escaped.py").exists()
    assert loop.repo.candidates() == []
    logged = transcript_path(loop.ws.root, "tiny", 0).read_text().splitlines()
    assert len(logged) == 11 and not any(json.loads(line)["ok"] for line in logged[:-1])


def test_flags_choose_the_round_and_budgets(tmp_path):
    loop = make_loop(tmp_path)
    at_propose(loop)

    async def drive(session: ClientSession) -> None:
        assert (await ok(session, "list_rollouts", {}))["total"] == 0  # round 1: only a held-out rollout
        await err(session, "list_rollouts", {}, "budget_exhausted")

    over_mcp(loop.ws.root, drive, "--round", "1", "--max-calls", "1")


def initialized(workdir: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    """The server's instructions, and the answer to one list_rollouts call."""
    async def drive(session: ClientSession) -> dict[str, Any]:
        return (await call(session, "list_rollouts", {"limit": 100}))[1]

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    params = StdioServerParameters(command=sys.executable, args=["-m", "evotrainer", "mcp", "--workdir",
                                                                 str(workdir), *extra], env=env, cwd=str(ROOT))

    async def main() -> tuple[str, dict[str, Any]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            return init.instructions or "", await drive(session)

    return anyio.run(main)


def test_a_finished_run_serves_its_last_round_not_the_next(tmp_path):
    """A finished `make train` leaves coevolve.json at the next round's `train` stage: the server
    serves the last finished round (round 1 here), where it used to serve round 2 and every
    round-scoped call failed with "run 'tiny' has no round 2"."""
    loop = make_loop(tmp_path)
    RunState(run="tiny", domain="math", round=2, stage="train").save(loop.state_path)
    instructions, answer = initialized(loop.ws.root)
    assert "round 1 of run 'tiny'" in instructions
    assert answer["ok"] and answer["result"]["total"] == 0  # round 1: its only rollout is held out
    # and a run in the middle of its first round still serves that round
    RunState(run="tiny", domain="math", round=0, stage="propose").save(loop.state_path)
    instructions, answer = initialized(loop.ws.root)
    assert "round 0 of run 'tiny'" in instructions and answer["result"]["total"] == 64


def test_a_workspace_of_imported_rollouts_serves_the_store_run(tmp_path):
    """No coevolve.json (rollouts imported from another trainer): the store's only run, at its
    last round."""
    loop = make_loop(tmp_path)
    assert not loop.state_path.exists()
    instructions, answer = initialized(loop.ws.root)
    assert "round 1 of run 'tiny'" in instructions and answer["ok"]
    out = subprocess.run([sys.executable, "-m", "evotrainer", "mcp", "--workdir", str(loop.ws.root), "--run", "nope"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=str(ROOT))
    assert out.returncode == 2 and "no such run in the store" in out.stderr and "Traceback" not in out.stderr


def test_a_workspace_without_a_run_is_a_clear_error(tmp_path):
    loop = Coevolution(plain_config(tmp_path), tmp_path / "work")  # a workspace, no coevolve.json
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "evotrainer", "mcp", "--workdir", str(loop.ws.root)],
                         capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "no co-evolution run" in out.stderr and "--agent external" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_a_timeout_ends_the_proposals_with_none(tmp_path):
    loop = make_loop(tmp_path, timeout_s=0.5)
    state = at_propose(loop)
    started = time.monotonic()
    loop.stage_propose(state)
    assert time.monotonic() - started < 10
    assert state.candidates == [] and state.agent["outcome"] == "timeout" and state.agent["submitted"] == 0
    assert read_done(loop.ws.root, "tiny", 0)["outcome"] == "timeout"
    with Toolbox(loop.ws.root, "tiny", 0) as tb:  # an agent that comes late cannot submit
        edits = partial_credit(loop)
        assert tb.call("write_candidate", {"slug": "late", "edits": edits, **CANDIDATE})["ok"]
        late = tb.call("submit_candidate", {"branch": "candidate/0-late"})
        assert late["error"]["kind"] == "refused" and "finished" in late["error"]["message"]
    assert read_submissions(loop.ws.root, "tiny", 0) == []
    loop.stage_backtest(state)
    loop.stage_promote(state)
    assert state.pending is None


def test_the_submit_limit_ends_the_wait_and_a_moved_branch_is_skipped(tmp_path):
    """A full set of submissions ends the wait without finish_round; a submitted branch whose head
    is no longer the submitted commit is skipped, since the gate must test what was submitted."""
    loop = make_loop(tmp_path, max_submissions=2)
    state = at_propose(loop)
    with Toolbox(loop.ws.root, "tiny", 0, max_submissions=2) as tb:
        edits = partial_credit(loop)
        for slug in ("pcf", "pcf-two"):
            assert tb.call("write_candidate", {"slug": slug, "edits": edits, **CANDIDATE})["ok"]
            assert tb.call("submit_candidate", {"branch": f"candidate/0-{slug}"})["ok"]
    loop.repo._run(["branch", "-f", "candidate/0-pcf-two", "main"])  # moved behind the agent's back
    loop.stage_propose(state)
    assert state.agent["outcome"] == "submit_limit"
    assert [c.branch for c in state.candidates] == ["candidate/0-pcf"]
    assert state.agent["skipped"] == ["candidate/0-pcf-two"]


def test_the_config_accepts_the_external_agent():
    from test_coevolve import TINY

    from evotrainer.config import load_config

    cfg = load_config(TINY, ["coevolve.agent=external", "coevolve.external.timeout_s=5"])
    assert cfg.coevolve.agent == "external" and cfg.coevolve.external.timeout_s == 5


def test_ctrl_c_while_waiting_leaves_the_round_open_to_resume(tmp_path):
    """A KeyboardInterrupt in the wait closes nothing: the agent can still submit, and the
    resumed wait (`coevolve --resume` runs stage_propose again) finds what it did."""
    from evotrainer.propose.external import wait_for_agent

    loop = make_loop(tmp_path)

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_for_agent(loop.ws.root, "tiny", 0, timeout_s=60, poll_s=0.1, max_submissions=1, sleep=interrupt)
    assert read_done(loop.ws.root, "tiny", 0) is None
    with Toolbox(loop.ws.root, "tiny", 0) as tb:
        assert tb.call("finish_round", {"note": "nothing worth submitting"})["ok"]
        assert tb.call("finish_round", {})["error"]["kind"] == "bad_arguments"  # once a round
    waited = wait_for_agent(loop.ws.root, "tiny", 0, timeout_s=60, poll_s=0.1, max_submissions=1, sleep=interrupt)
    assert (waited.outcome, waited.submissions, waited.note) == ("finished", [], "nothing worth submitting")
