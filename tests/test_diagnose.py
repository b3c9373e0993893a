"""Health reports on stored rollouts with known properties, and the `diagnose` CLI on imported ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from factories import make_rollout
from typer.testing import CliRunner

from evotrainer.api import Rollout, Turn, rollout_to_dict
from evotrainer.diagnose import HealthReport, health_report, write_report
from evotrainer.harness.loader import load_harness
from evotrainer.paths import HARNESSES_DIR
from evotrainer.store import Store, StoredRollout

SEED = HARNESSES_DIR / "math"
ENV = {"COLUMNS": "220", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}


def roll(rid: str, group: str, kind: str = "wrong", *, marker: bool = False, tokens: int = 8,
         truncated: bool = False, text: str | None = None, turns=(), meta=None, domain: str = "math") -> Rollout:
    ok = kind == "ok"
    flags = ("answer_marker",) if marker else ()
    text = text if text is not None else (f"Answer: {rid}" if marker else f"I think {len(rid)} maybe")
    return make_rollout(rid, task_id=f"task-{group}", group_id=group, domain=domain, prompt="What is 2 + 3?",
                        completion=text, turns=turns, success=ok, kind=kind, flags=flags, num_tokens=tokens,
                        truncated=truncated, meta=meta)


def batch() -> list[Rollout]:
    """10 groups of 4: 6 dead (every reward 0), 4 live (one success each); 6 of 40 truncated."""
    out = []
    for g in range(6):
        for i in range(4):
            cut = i == 0  # 6 truncated rollouts, all in dead groups
            # A cut-off answer can still be read (kind "wrong"): the seed pays it like the rest.
            out.append(roll(f"d{g}-{i}", f"dead{g}", "wrong", truncated=cut,
                            tokens=32 if cut else 10))
    for g in range(4):
        out.append(roll(f"l{g}-0", f"live{g}", "ok", marker=True))
        out += [roll(f"l{g}-{i}", f"live{g}", "wrong") for i in (1, 2, 3)]
    return out


def test_report_levels_examples_and_json(tmp_path: Path) -> None:
    harness = load_harness(SEED)
    rows = [StoredRollout(rollout=r, reward=None) for r in batch()]
    report = health_report(harness, rows, scope="synthetic")
    assert report.n_rollouts == 40 and report.n_groups == 10
    dead, trunc = report.get("dead_group_ratio"), report.get("truncation_rate")
    assert dead.value == pytest.approx(0.6) and dead.level == "critical"
    assert trunc.value == pytest.approx(0.15) and trunc.level == "warn"
    assert report.get("success_rate").value == pytest.approx(0.1) and report.get("success_rate").level == "warn"
    # Examples exemplify the alert: rollouts from distinct dead groups, truncated rollouts.
    assert len(dead.examples) == 3 and all(e.startswith("d") for e in dead.examples)
    assert len({e.split("-")[0] for e in dead.examples}) == 3
    assert trunc.examples and all(e.endswith("-0") and e.startswith("d") for e in trunc.examples)
    # Single-turn math: multi-turn, model-state and SWE probes are not measurable here.
    for name in ("abandonment_rate", "mean_turns", "mean_logprob", "mean_entropy", "tampering_rate",
                 "patch_apply_rate"):
        assert report.get(name).value is None and report.get(name).level == "n/a", name
    assert report.get("format_error_rate").level == "ok" and not report.get("format_error_rate").examples
    assert {p.dimension for p in report.probes} == {"result", "behaviour", "efficiency", "model_state",
                                                    "test_structure"}
    assert [a.name for a in report.alerts][0] == "dead_group_ratio"  # critical first
    assert {"truncation_rate", "success_rate"} <= {a.name for a in report.alerts}

    data = json.loads(json.dumps(report.to_json()))
    assert data["n_rollouts"] == 40 and "dead_group_ratio" in data["alerts"]
    for probe in data["probes"]:
        assert {"name", "dimension", "value", "level"} <= set(probe)
    assert set(data["examples"]) >= set(dead.examples)
    again = HealthReport.from_json(data)
    assert again.get("dead_group_ratio") == dead and again.alerts == report.alerts

    md_path, json_path = write_report(report, tmp_path / "diagnostics", "r0")
    assert json.loads(json_path.read_text()) == data and md_path.read_text() == report.to_markdown()
    md = report.to_markdown()
    assert "## result" in md and "| dead_group_ratio | 0.6 | critical |" in md and "## Examples" in md


def test_false_drop_rate_is_measured_from_the_harness_filters() -> None:
    from evotrainer.harness.loader import Harness, read_sources

    sources = read_sources(SEED)
    seed = health_report(load_harness(SEED), batch()).get("false_drop_rate")
    assert seed.value == 0.0 and seed.level == "ok"  # the seed keeps everything
    # A filter that drops short completions drops the 4 successes (8 tokens each).
    short = sources["filters.py"].replace("def keep_rollout(rollout: Rollout) -> bool:\n    return True",
                                          "def keep_rollout(rollout: Rollout) -> bool:\n    return rollout.num_tokens > 9")
    assert short != sources["filters.py"]
    probe_named_so = sources["diagnostics.py"] + (
        "\nPROBES.append(probe('false_drop_rate', 'result', lambda rs, ws: 0.0, 0.05, 0.2, 'above'))\n")
    report = health_report(Harness({**sources, "filters.py": short, "diagnostics.py": probe_named_so}, Path("x")),
                           batch())
    drops = [p for p in report.probes if p.name == "false_drop_rate"]
    assert len(drops) == 1, "the trusted value replaces a harness probe of the same name"
    assert drops[0].value == 1.0 and drops[0].level == "critical"
    assert drops[0].examples and all(e.startswith("l") and e.endswith("-0") for e in drops[0].examples)
    # No verified success: nothing to drop, not measurable.
    failures = [r for r in batch() if not r.outcome.success]
    assert health_report(load_harness(SEED), failures).get("false_drop_rate").level == "n/a"


def test_mid_band_weight_reads_the_curriculum_over_the_rounds_history() -> None:
    from evotrainer.api import TaskStats
    from evotrainer.faultbench import load_case
    from evotrainer.harness.loader import Harness
    from evotrainer.paths import FAULT_CASES_DIR

    history = [TaskStats(f"solved{i}", 8, 8) for i in range(4)] + [TaskStats(f"mid{i}", 8, 3) for i in range(2)] \
        + [TaskStats(f"new{i}", 0, 0) for i in range(10)] + [TaskStats("held", 8, 4, {"split": "heldout"})]
    seed = health_report(load_harness(SEED), batch(), task_stats=history).get("mid_band_weight")
    assert seed.value == pytest.approx(1.0) and seed.level == "ok"  # uniform weights
    assert health_report(load_harness(SEED), batch()).get("mid_band_weight") is None  # no history given
    starving = Harness(load_case(FAULT_CASES_DIR / "math-curriculum-starves-mid").harness, Path("x"))
    probe = health_report(starving, batch(), task_stats=history).get("mid_band_weight")
    assert probe.value == pytest.approx(0.05 / ((14 + 0.1) / 16)) and probe.level == "critical"
    # Without a mid-band task in the history (held-out tasks do not count) there is nothing to weigh.
    assert health_report(starving, batch(), task_stats=history[:4] + history[-1:]).get("mid_band_weight").level == "n/a"


def test_model_state_and_multi_turn_probes() -> None:
    harness = load_harness(SEED)
    edit = Turn("assistant", "sed -i 's/a/b/' x.py")
    rows = [
        roll("a", "g", meta={"mean_logprob": -0.005, "entropy": 0.02},
             turns=(Turn("user", "fix it"), Turn("assistant", "ls"), Turn("tool", "x.py"))),
        roll("b", "g", "ok", meta={"mean_logprob": -0.015, "entropy": 0.04},
             turns=(Turn("user", "fix it"), edit, Turn("tool", "ok"), Turn("assistant", "pytest"))),
    ]
    report = health_report(harness, rows)
    assert report.get("mean_logprob").value == pytest.approx(-0.01) and report.get("mean_logprob").level == "warn"
    assert report.get("mean_entropy").value == pytest.approx(0.03) and report.get("mean_entropy").level == "warn"
    assert report.get("mean_turns").value == pytest.approx(1.5) and report.get("mean_turns").level == "critical"
    assert report.get("abandonment_rate").value == pytest.approx(0.5)  # "a" failed after 1 turn, no edit
    assert report.get("abandonment_rate").examples == ("a",)


def test_echo_traps_duplicates_and_probe_errors(tmp_path: Path) -> None:
    folder = tmp_path / "h"
    shutil.copytree(SEED, folder)
    with open(folder / "diagnostics.py", "a") as f:
        f.write("\ndef _boom(rs, ws):\n    raise RuntimeError('no')\n\n"
                "PROBES.append({'name': 'boom', 'dimension': 'result', 'fn': _boom, 'warn': 1,"
                " 'critical': 2, 'direction': 'above'})\n")
    harness = load_harness(folder)
    loop = "Answer: 5\nAnswer: 5\nAnswer: 5\nAnswer: 5"
    rows = [roll("e1", "g", text=loop), roll("e2", "g", text=loop), roll("e3", "g", text="7"),
            roll("e4", "g", text="so 7 then 7 then")]
    report = health_report(harness, rows)
    assert report.get("echo_trap_rate").value == pytest.approx(0.5)
    assert set(report.get("echo_trap_rate").examples) == {"e1", "e2"}
    assert report.get("duplicate_rate").value == pytest.approx(0.25)
    boom = report.get("boom")
    assert boom.level == "n/a" and boom.value is None and "RuntimeError" in boom.error
    assert "error:" in report.to_markdown()


def _jsonl(path: Path, rollouts: list[Rollout]) -> Path:
    path.write_text("".join(json.dumps(rollout_to_dict(r)) + "\n" for r in rollouts))
    return path


def test_diagnose_cli_on_imported_rollouts(tmp_path: Path) -> None:
    from evotrainer.cli.main import app

    cli = CliRunner()
    work = tmp_path / "work"
    work.mkdir()  # import never creates the workspace folder
    src = _jsonl(tmp_path / "rollouts.jsonl", batch())
    res = cli.invoke(app, ["rollouts", "import", str(src), "--workdir", str(work)], env=ENV)
    assert res.exit_code == 0 and "imported 40" in res.stdout, res.output

    # No harness repo, no training run: the shipped seed harness judges the imported rollouts.
    res = cli.invoke(app, ["diagnose", "--workdir", str(work)], env=ENV)
    assert res.exit_code == 0, res.output
    for text in ("result", "behaviour", "efficiency", "model_state", "dead_group_ratio", "critical",
                 "truncation_rate", "warn", "rollout d0-0"):
        assert text in res.stdout, text
    assert "using shipped math seed" in res.stderr
    data = json.loads((work / "diagnostics" / "all-math.json").read_text())
    levels = {p["name"]: p["level"] for p in data["probes"]}
    assert levels["dead_group_ratio"] == "critical" and levels["truncation_rate"] == "warn"
    assert "| dead_group_ratio |" in (work / "diagnostics" / "all-math.md").read_text()

    # With a workspace, the harness comes from the repo at --rev.
    assert cli.invoke(app, ["init", "--domain", "math", "--workdir", str(work)], env=ENV).exit_code == 0
    res = cli.invoke(app, ["diagnose", "--workdir", str(work), "--json", "--name", "x"], env=ENV)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["n_rollouts"] == 40 and len(data["harness_version"]) == 40
    assert (work / "diagnostics" / "x.md").is_file()
    res = cli.invoke(app, ["diagnose", "--workdir", str(work), "--rev", "nope"], env=ENV)
    assert res.exit_code == 2 and "unknown revision 'nope'" in res.stderr
    res = cli.invoke(app, ["diagnose", "--workdir", str(work), "--run", "nope"], env=ENV)
    assert res.exit_code == 2 and "no run named" in res.stderr
    res = cli.invoke(app, ["diagnose", "--workdir", str(tmp_path / "empty")], env=ENV)
    assert res.exit_code == 2 and "no store" in res.stderr


def test_diagnose_cli_selects_run_and_round(tmp_path: Path) -> None:
    from evotrainer.cli.main import app

    work = tmp_path / "w"
    rollouts = batch()
    with Store.open(work) as store:
        run = store.get_or_create_run("r", "math", {})
        r0, r1 = store.start_round(run, 0, "h", "m"), store.start_round(run, 1, "h", "m")
        # Round 0 holds the dead groups, round 1 the live ones.
        store.add_rollouts(StoredRollout(rollout=r, run_id=run, round_id=r0 if r.group_id.startswith("dead") else r1)
                           for r in rollouts)
    res = CliRunner().invoke(app, ["diagnose", "-w", str(work), "--run", "r", "--round", "1", "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["n_rollouts"] == 16 and data["scope"].startswith("run=r, round=1")
    levels = {p["name"]: (p["value"], p["level"]) for p in data["probes"]}
    assert levels["dead_group_ratio"] == (0.0, "ok")
    assert (work / "diagnostics" / "r-round1-math.json").is_file()
