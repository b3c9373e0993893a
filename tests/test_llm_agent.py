"""The `llm` outer agent against a real chat-completions server on loopback (tests/llm_server.py)."""

import json

import pytest
from factories import make_rollout
from llm_server import ChatServer

from evotrainer.api import Rollout
from evotrainer.chat import EndpointError
from evotrainer.diagnose import health_report
from evotrainer.harness.loader import Harness, read_sources
from evotrainer.paths import HARNESSES_DIR
from evotrainer.propose.base import Evidence, Proposal, get_agent
from evotrainer.propose.llm import LLMAgent

# The files the tests edit are written here, so a change to the seed harness cannot break them.
REWARD = '''"""Reward components: verified correctness plus a small bonus for the answer marker."""

from evotrainer.api import Rollout


def reward(rollout: Rollout) -> dict[str, float]:
    return {
        "correct": 1.0 if rollout.outcome.success else 0.0,
        "format": 1.0 if "answer_marker" in rollout.outcome.flags else 0.0,
    }
'''
FILTERS = '''"""Filters: keep everything."""

from typing import Sequence

from evotrainer.api import Rollout


def keep_rollout(rollout: Rollout) -> bool:
    return True


def keep_group(rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
    return True
'''
SPEC = """grpo:
  num_generations: 2
  beta: 0.0
reward_weights:
  correct: 1.0
  format: 0.1
"""
OLD_FORMAT = '"format": 1.0 if "answer_marker" in rollout.outcome.flags else 0.0,'
NEW_FORMAT = ('"format": 1.0 if "answer_marker" in rollout.outcome.flags '
              'else (0.5 if "Answer" in rollout.completion else 0.0),')


def _rollout(i: int, success: bool, completion: str, group: str = "g0") -> Rollout:
    return make_rollout(f"r{i}", task_id="add-2-3", group_id=group, prompt="What is 2 + 3?", completion=completion,
                        num_tokens=7, success=success)


def _proposal(slug="partial-format-credit", edits=None, targets="dead_group_ratio", **extra):
    return {"slug": slug, "diagnosis": "75% of groups are dead: every rollout scores 0",
            "targets": targets, "expected": "dead_group_ratio 0.75 -> 0.4",
            "edits": edits if edits is not None else [{"file": "reward.py", "search": OLD_FORMAT,
                                                       "replace": NEW_FORMAT}], **extra}


def _reply(*proposals) -> str:
    return json.dumps({"proposals": list(proposals)})


@pytest.fixture
def server():
    with ChatServer() as chat:
        yield chat


@pytest.fixture
def agent(server, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    return LLMAgent(base_url=server.url, model="test-model", api_key="sk-test", max_retries=2)


@pytest.fixture(scope="module")
def sources():
    return {**read_sources(HARNESSES_DIR / "math"), "reward.py": REWARD, "filters.py": FILTERS, "harness.yaml": SPEC}


@pytest.fixture(scope="module")
def evidence(sources, tmp_path_factory):
    samples = [_rollout(0, True, "Answer: 5", "g0"), _rollout(1, False, "Answer: 4", "g0"),
               _rollout(2, False, "the sum is probably six", "g1"), _rollout(3, False, "seven", "g1")]
    report = health_report(Harness(sources, tmp_path_factory.mktemp("harness")), samples)
    return Evidence(round_index=1, domain="math", report=report, samples=samples)


def test_valid_proposal_becomes_a_full_file_edit_that_loads(server, agent, sources, evidence, tmp_path):
    server.add("Here is my proposal:\n```json\n" + _reply(_proposal()) + "\n```\n")
    proposals = agent.propose(evidence, sources, skills=[])
    assert len(proposals) == 1
    p = proposals[0]
    assert isinstance(p, Proposal)
    assert (p.slug, p.targets) == ("partial-format-credit", "dead_group_ratio")
    assert p.edits == {"reward.py": sources["reward.py"].replace(OLD_FORMAT, NEW_FORMAT)}
    assert "0.75 -> 0.4" in p.expected and "dead" in p.diagnosis
    harness = Harness({**sources, **p.edits}, tmp_path)
    assert harness.reward(_rollout(2, False, "Answer: 6")) == {"correct": 0.0, "format": 0.5}
    assert agent.last_errors == []
    [request] = server.requests
    assert request["body"]["model"] == "test-model"
    assert request["headers"]["authorization"] == "Bearer sk-test"


def test_prompt_holds_report_rollouts_harness_source_skills_and_metrics(server, agent, sources, evidence):
    server.add(_reply())
    skill = {"name": "zero-variance-group-filter", "summary": "drop groups without reward variance",
             "trigger": {"probe": "dead_group_ratio", "condition": "> 0.5"},
             "expected": "dead_group_ratio falls to 0", "domains": ["math", "code"]}
    other = {"name": "test-tampering-penalty", "summary": "x", "domains": ["swe"]}
    assert agent.propose(evidence, sources, skills=[skill, other]) == []
    prompt = server.completions()[0]["messages"][0]["content"]
    assert evidence.report.to_markdown().strip() in prompt
    for name in ("reward.py", "filters.py", "harness.yaml", "diagnostics.py"):
        assert sources[name].strip() in prompt
    rollouts = prompt[prompt.index("## Rollouts"):prompt.index("## Harness files")]
    assert rollouts.index("the sum is probably six") < rollouts.index("Answer: 5\n")  # failing first
    assert "zero-variance-group-filter" in prompt and "condition: > 0.5" in prompt
    assert "test-tampering-penalty" not in prompt  # another domain's skill
    assert "hacking_reward_mass" in prompt and '"proposals"' in prompt


def test_malformed_reply_is_retried_with_the_error(server, agent, sources, evidence):
    server.add("I would add a zero-variance filter.", _reply(_proposal()))
    proposals = agent.propose(evidence, sources, skills=[])
    assert [p.slug for p in proposals] == ["partial-format-credit"]
    first, second = server.completions()
    assert len(second["messages"]) == 3
    assert second["messages"][1] == {"role": "assistant", "content": "I would add a zero-variance filter."}
    assert "not JSON" in second["messages"][2]["content"]
    assert len(agent.last_errors) == 1 and "attempt 1" in agent.last_errors[0]


def test_always_malformed_is_skipped_with_a_reason(server, agent, sources, evidence):
    server.add("no", "still no", '{"proposal": []}')
    assert agent.propose(evidence, sources, skills=[]) == []
    assert len(server.completions()) == 3  # the first try and max_retries=2 retries
    assert agent.last_errors[-1].startswith("skipped after 3 attempts")
    assert '"proposals" list' in agent.last_errors[-1]


@pytest.mark.parametrize("bad, error", [
    (_proposal(edits=[{"file": "reward.py", "search": "return {'correct': 2.0}", "replace": "x"}]),
     "does not occur in reward.py"),
    (_proposal(edits=[{"file": "reward.py", "search": "1.0 if", "replace": "2.0 if"}]), "occurs 2 times"),
    (_proposal(targets="mean_reward"), "unknown metric 'mean_reward'"),
    (_proposal(edits=[{"file": "reward.py", "search": "return {", "replace": "return {{"}]), "syntax error"),
    (_proposal(edits=[{"file": "filters.py", "search": "def keep_group(", "replace": "def keep_groups("}]),
     "keep_group() is not defined"),
    (_proposal(edits=[{"file": "filters.py", "search": "from typing import Sequence",
                       "replace": "import subprocess\nfrom typing import Sequence"}]), "does not load"),
    (_proposal(edits=[{"file": "harness.yaml", "search": "beta: 0.0", "replace": "beta: -1"}]),
     "grpo.beta: must be a number in [0, 10], got -1"),
    (_proposal(edits=[{"file": "reward.py", "search": "", "replace": "x = 1\n"}]), "search is empty"),
    (_proposal(edits=[{"file": "reward.py", "search": OLD_FORMAT}]), "replace must be a string"),
])
def test_an_unusable_proposal_is_a_malformed_reply(server, agent, sources, evidence, bad, error):
    server.add(_reply(bad), _reply(_proposal()))
    proposals = agent.propose(evidence, sources, skills=[])
    assert [p.edits for p in proposals] == [{"reward.py": sources["reward.py"].replace(OLD_FORMAT, NEW_FORMAT)}]
    retry = server.completions()[1]["messages"][-1]["content"]
    assert error in retry, retry
    assert error in agent.last_errors[0]


@pytest.mark.parametrize("path", ["../evil.py", "/etc/passwd", "sub/x.py", ".git/config", ".gitattributes",
                                  "..\\evil.py", "C:/evil.py", "./reward.py"])
def test_an_edit_outside_the_harness_is_refused_not_applied(server, agent, sources, evidence, path):
    evil = _proposal(slug="escape", edits=[{"file": "reward.py", "search": OLD_FORMAT, "replace": NEW_FORMAT},
                                           {"file": path, "search": "", "replace": "import os\n"}])
    server.add(_reply(evil))
    assert agent.propose(evidence, sources, skills=[]) == []
    assert len(server.completions()) == 1  # refused, not retried
    [reason] = agent.last_errors
    assert reason.startswith("refused proposal 'escape'") and repr(path) in reason


def test_a_refused_proposal_does_not_sink_the_others(server, agent, sources, evidence):
    evil = _proposal(slug="escape", edits=[{"file": "../evil.py", "search": "", "replace": "x = 1\n"}])
    server.add(_reply(evil, _proposal()))
    assert [p.slug for p in agent.propose(evidence, sources, skills=[])] == ["partial-format-credit"]
    assert "refused" in agent.last_errors[0]


def test_an_empty_search_creates_a_new_file(server, agent, sources, evidence):
    server.add(_reply(_proposal(slug="Notes!", targets="mean_tokens",
                                edits=[{"file": "NOTES.md", "search": "", "replace": "why\n"}])))
    [p] = agent.propose(evidence, sources, skills=[])
    assert (p.slug, p.edits) == ("notes", {"NOTES.md": "why\n"})


def test_cut_off_reply_is_retried(server, agent, sources, evidence):
    server.add({"content": '{"proposals": [{"slug": "a", "diag', "finish_reason": "length"}, _reply(_proposal()))
    assert len(agent.propose(evidence, sources, skills=[])) == 1
    assert "cut off" in server.completions()[1]["messages"][-1]["content"]


def test_a_report_without_to_markdown_is_shown_as_text(server, agent, sources, evidence):
    server.add(_reply())
    agent.propose(Evidence(round_index=0, domain="math", report="3 of 4 groups are dead", samples=()),
                  sources, skills=[])
    assert "3 of 4 groups are dead" in server.completions()[0]["messages"][0]["content"]


def test_max_proposals(server, sources, evidence):
    agent = LLMAgent(base_url=server.url, model="m", max_proposals=1)
    other = _proposal(slug="bigger-format-weight", targets="effective_data_ratio",
                      edits=[{"file": "harness.yaml", "search": "format: 0.1", "replace": "format: 0.3"}])
    server.add(_reply(other, _proposal()))
    assert [p.slug for p in agent.propose(evidence, sources, skills=[])] == ["bigger-format-weight"]


def test_config_from_env_and_registry(server, sources, evidence, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_LLM_BASE_URL", server.url)
    monkeypatch.setenv("EVOTRAINER_LLM_MODEL", "env-model")
    monkeypatch.setenv("MY_KEY", "sk-from-env")
    agent = get_agent("llm", api_key_env="MY_KEY")
    assert isinstance(agent, LLMAgent)
    server.add(_reply())
    agent.propose(evidence, sources, skills=[])
    [request] = server.requests
    assert request["body"]["model"] == "env-model"
    assert request["headers"]["authorization"] == "Bearer sk-from-env"


def test_no_model_is_a_config_error(monkeypatch):
    monkeypatch.delenv("EVOTRAINER_LLM_MODEL", raising=False)
    with pytest.raises(ValueError, match="no model"):
        LLMAgent(base_url="http://127.0.0.1:9/v1")


def test_an_endpoint_error_is_raised_not_retried(server, agent, sources, evidence):
    server.add({"status": 401, "message": "bad key", "type": "invalid_api_key"})
    with pytest.raises(EndpointError, match="bad key"):
        agent.propose(evidence, sources, skills=[])
    assert len(server.requests) == 1
