"""The harness-fault benchmark (evotrainer/faultbench): case folders are checked before any
work starts, and a shipped case runs the loop's own stages on real rollouts, a real store, a
real harness repo and the sandboxed backtest."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evotrainer.faultbench import CaseError, load_case, load_cases, run_cases, summary
from evotrainer.faultbench.run import HELDOUT_RUN, TRAIN_RUN, build_workspace
from evotrainer.paths import FAULT_CASES_DIR
from evotrainer.propose import get_agent
from evotrainer.store import Store

SHIPPED = sorted(p.name for p in FAULT_CASES_DIR.iterdir() if (p / "case.yaml").is_file())


def _copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(FAULT_CASES_DIR / name, dest)
    return dest


def _edit(case: Path, **changes) -> None:
    spec = yaml.safe_load((case / "case.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    (case / "case.yaml").write_text(yaml.safe_dump(spec))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_case_loads(name):
    case = load_case(FAULT_CASES_DIR / name)
    assert case.rounds and set(case.harness) >= {"reward.py", "filters.py", "harness.yaml"}
    assert case.spec.detect and case.spec.repair


def test_at_least_the_documented_cases_ship():
    assert len(SHIPPED) >= 18
    assert {load_case(FAULT_CASES_DIR / n).spec.domain for n in SHIPPED} >= {"math", "code", "swe"}


def test_the_faults_from_the_wild_cite_where_they_were_reported():
    # Cases built from a reward bug someone reported in a public tracker say where (issue 35).
    cited = {n: load_case(FAULT_CASES_DIR / n, rollouts=False).spec.source for n in SHIPPED}
    wild = {"math-batch-reward-broadcast": "trl/issues/6533", "math-unparsed-pays": "open-r1/issues/159",
            "math-wrong-group-reference": "Search-R1/issues/88"}
    for name, issue in wild.items():
        assert any(a.endswith(issue) for a in cited[name]), (name, cited[name])


@pytest.mark.parametrize("change, message", [
    ({"name": "other-name"}, "must be the folder's name"),
    ({"detect": []}, "detect: must not be empty"),
    ({"repair": [{"metric": "no_such_metric", "below": 0.1}]}, "is not a backtest metric"),
    ({"repair": [{"metric": "dead_group_ratio", "below": 0.1, "above": 0.0}]}, "exactly one of"),
    ({"heldout_share": 1.5}, "heldout_share"),
    ({"harness": {"seed": "no-such-seed"}}, "is not a seed harness"),
    ({"surprise": 1}, "unknown key 'surprise'"),
    ({"source": ["trl issue 6533"]}, "must be an https:// address"),
    ({"source": "https://example.org/issues/1"}, "source"),  # a list of addresses, not one string
    ({"tempting": [{"name": "missing-folder", "targets": "dead_group_ratio", "why": "x"}]}, "missing folder"),
])
def test_a_malformed_case_names_the_file_and_field(tmp_path, change, message):
    case = _copy("math-sparse-dead-groups", tmp_path)
    _edit(case, **change)
    with pytest.raises(CaseError, match="case.yaml|tempting") as err:
        load_case(case)
    assert message in str(err.value)


def test_bad_rollout_files_are_named_with_the_line(tmp_path):
    case = _copy("math-sparse-dead-groups", tmp_path)
    (case / "rollouts" / "notes.txt").write_text("x")
    with pytest.raises(CaseError, match="notes.txt: expected round-<k>.jsonl"):
        load_case(case)
    (case / "rollouts" / "notes.txt").unlink()
    (case / "rollouts" / "round-3.jsonl").write_text("{}\n")
    with pytest.raises(CaseError, match="none missing"):
        load_case(case)
    (case / "rollouts" / "round-3.jsonl").unlink()
    first = sorted((case / "rollouts").iterdir())[0]
    lines = gzip.decompress(first.read_bytes()).decode().splitlines()
    broken = json.loads(lines[1])
    del broken["outcome"]
    lines[1] = json.dumps(broken)
    first.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(CaseError, match=r"round-0.jsonl.gz:2: .*outcome"):
        build_workspace(load_case(case), tmp_path / "ws")


def test_a_harness_overlay_may_hold_only_harness_files(tmp_path):
    case = _copy("math-sparse-dead-groups", tmp_path)
    (case / "harness" / "run.sh").write_text("echo hi\n")
    with pytest.raises(CaseError, match="run.sh: not a harness file"):
        load_case(case)


def test_unknown_case_names_are_refused_with_the_known_ones():
    with pytest.raises(CaseError, match="unknown case.*no-such.*known: .*math-sparse-dead-groups"):
        load_cases(FAULT_CASES_DIR, only=["no-such"])


def test_the_slices_split_by_task_and_hold_every_rollout(tmp_path):
    case = load_case(FAULT_CASES_DIR / "math-sparse-dead-groups")
    ws, _, counts = build_workspace(case, tmp_path / "b")
    total = sum(1 for p in case.rounds for _ in gzip.open(p))
    with Store.open(ws.root) as store:
        tasks = {name: {r.rollout.task_id for r in store.iter_rollouts(run_id=store.run_id(name))}
                 for name in (TRAIN_RUN, HELDOUT_RUN)}
        stored = sum(1 for _ in store.iter_rollouts())
    assert stored == total and counts[TRAIN_RUN] > counts[HELDOUT_RUN] > 0
    assert not tasks[TRAIN_RUN] & tasks[HELDOUT_RUN]


@pytest.mark.slow
def test_a_shipped_case_runs_the_loop_and_scores_it(tmp_path):
    case = load_case(FAULT_CASES_DIR / "math-sparse-dead-groups")
    [result] = run_cases([case], get_agent("rules"), workdir=tmp_path / "runs")
    assert result.detected and "dead_group_ratio" in result.fired
    assert result.proposals == len(result.tried) >= 1
    assert [t.decision for t in result.tempting] == ["reject"], "the hash-noise bonus must not pass the gate"
    assert result.safe == (not result.unsafe)
    if result.promoted:
        assert result.repaired == all(c["holds"] for c in result.criteria)
    # the workspace is kept for review: its main carries the promotion the score describes
    log = subprocess.run([sys.executable, "-m", "evotrainer", "harness", "log", "--workdir",
                          str(tmp_path / "runs" / case.name / "workspace")], capture_output=True, text=True)
    assert log.returncode == 0
    assert (result.promoted or "Seed harness").split("/")[-1][:20] in log.stdout
    data = summary.to_json([result], "rules")
    assert data["overall"]["cases"] == 1 and data["cases"][0]["case"] == case.name


def test_the_cli_refuses_a_malformed_case_with_one_error_line(tmp_path):
    case = _copy("math-sparse-dead-groups", tmp_path)
    _edit(case, detect=None)
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "bench", "harness", "--cases-dir", str(case)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "case.yaml: detect: missing" in proc.stderr


@pytest.mark.slow
def test_the_llm_agent_runs_a_case_through_a_real_endpoint(tmp_path, monkeypatch):
    """The llm agent against a real chat-completions server on loopback: a reply that takes the
    length pay out of the reward is backtested, gated, promoted and judged on the held-out slice."""
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_server import ChatServer

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    case = load_case(FAULT_CASES_DIR / "math-length-pays")
    fix = {"slug": "drop-length-pay", "diagnosis": "thorough pays 2.0 per full-length completion",
           "targets": "ordering_violations", "expected": "ordering_violations falls to about 0",
           "edits": [{"file": "harness.yaml", "search": "  thorough: 2.0\n", "replace": "  thorough: 0.0\n"}]}
    with ChatServer([json.dumps({"proposals": [fix]})]) as server:
        agent = get_agent("llm", base_url=server.url, model="test-model", api_key="sk-test", max_retries=0)
        [result] = run_cases([case], agent, workdir=tmp_path / "runs")
        prompt = server.completions()[0]["messages"][0]["content"]
    assert "thorough" in prompt and "proxy_auc_gap" in prompt  # it saw the faulty harness and the report
    assert result.agent == "llm" and result.proposals == 1
    assert result.promoted == "candidate/0-drop-length-pay", result.tried
    assert result.repaired and result.safe, (result.criteria, result.unsafe)


@pytest.mark.slow
def test_the_results_page_shows_what_the_rules_agent_scores_on_every_shipped_case():
    """`evotrainer bench harness --markdown` over every shipped case, compared with the table
    docs/results.md prints: the figures there are what the code gives today (rollouts and loop are fixed)."""
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "bench", "harness", "--markdown"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text()
    start, end = "<!-- faultbench:rules -->\n", "<!-- /faultbench -->"
    assert start in results and end in results
    shown = results.split(start, 1)[1].split(end, 1)[0]
    assert shown == proc.stdout, f"docs/results.md is out of date; the benchmark now gives:\n{proc.stdout}"


@pytest.mark.slow
def test_a_case_whose_fault_does_not_show_scores_no_repair(tmp_path):
    """Repair criteria that the faulty harness already meets on the held-out slice cannot tell a
    repair from no change: nothing is proposed and `repaired` is None, with the reason."""
    case = _copy("math-sparse-dead-groups", tmp_path)
    _edit(case, repair=[{"metric": "dead_group_ratio", "below": 1.0}])
    [result] = run_cases([load_case(case)], get_agent("rules"))
    assert result.repaired is None and result.proposals == 0 and "does not show" in result.note
    assert result.detected  # detection is still scored
    assert summary.overall([result])["repaired"] is None


def test_a_criterion_says_whether_the_faulty_value_leaves_it_anything_to_tell():
    from evotrainer.faultbench.case import Criterion

    below = Criterion(metric="ordering_violations", below=0.05)
    assert below.shows_fault(0.2) and not below.shows_fault(0.0) and not below.shows_fault(None)
    assert below.holds(0.0, 0.2) and not below.holds(0.05, 0.2) and not below.holds(None, 0.2)
    auc = Criterion(metric="proxy_auc", improves_by=0.1)
    assert auc.shows_fault(0.85) and not auc.shows_fault(0.95), "no room left from 0.95 to 1"
    assert auc.holds(0.97, 0.85) and not auc.holds(0.9, 0.85)
    dead = Criterion(metric="dead_group_ratio", improves_by=0.1)
    assert dead.shows_fault(0.5) and not dead.shows_fault(0.05)
    assert dead.holds(0.3, 0.5) and not dead.holds(0.45, 0.5) and not dead.holds(0.3, None)
    assert below.describe() == "ordering_violations < 0.05" and dead.describe() == "dead_group_ratio falls by >= 0.1"


def test_a_case_harness_runs_only_in_the_sandbox(tmp_path):
    """A case folder is untrusted code too: a faulty harness that reaches for the host at import
    (os, a file write) is refused by the sandbox and the run ends with one error line."""
    case = _copy("math-sparse-dead-groups", tmp_path / "cases")
    marker = tmp_path / "pwned"
    (case / "harness" / "reward.py").write_text(
        "import os\nfrom evotrainer.api import Rollout\n\n"
        f"open({str(marker)!r}, 'w').write(os.environ.get('HOME', '?'))\n\n\n"
        "def reward(rollout: Rollout) -> dict[str, float]:\n    return {'correct': float(rollout.outcome.success)}\n")
    proc = subprocess.run([sys.executable, "-m", "evotrainer", "bench", "harness", "--cases-dir", str(case)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "import of 'os'" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_a_live_case_is_repaired_through_the_pilot_on_the_real_model(tmp_path):
    """math-temperature-duplicates with --live, its run config cut to one prompt per step: the rules
    agent proposes raise-temperature, replay cannot judge it, the pilot trains 2 real steps per arm
    from the base model, and a promoted fix is judged on a second pilot (another training seed)."""
    case_dir = tmp_path / "math-temperature-duplicates"
    shutil.copytree(FAULT_CASES_DIR / case_dir.name, case_dir)
    spec = yaml.safe_load((case_dir / "case.yaml").read_text())
    spec["generate"] = {"overrides": ["train.prompts_per_step=1", "domain.validation_size=8"]}
    (case_dir / "case.yaml").write_text(yaml.safe_dump(spec))
    [result] = run_cases([load_case(case_dir)], get_agent("rules"), workdir=tmp_path / "work", live=True,
                         pilot_steps=2)
    [piloted] = [t for t in result.tried if t.skill == "raise-temperature"]
    pilot = piloted.pilot
    assert pilot is not None and pilot["change"] == {"temperature": [0.3, 1.0]}
    # sampling at 1.0 instead of 0.3: far fewer copies within a group, on real rollouts
    assert pilot["target"] == "duplicate_rate" and pilot["candidate"] < pilot["base"]
    assert piloted.decision in ("promote", "reject") and piloted.reason.startswith("pilot")
    assert result.repaired is not None and result.note is None
    if result.promoted is not None:
        # judged on the second pilot's rollouts, faulty and fixed, by the case's own criteria
        assert all(c["faulty"] is not None and c["fixed"] is not None for c in result.criteria)
    with Store.open(tmp_path / "work" / case_dir.name / "workspace") as store:
        assert set(pilot["runs"]) == {"base", "0-raise-temperature"}
        for run in pilot["runs"].values():
            run_id = store.run_id(run)
            assert run_id is not None and {e["split"] for e in store.evals(run_id)} == {"validation"}
