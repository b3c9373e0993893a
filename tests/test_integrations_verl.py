"""verl beside evotrainer, with the real verl package (0.9.x, installed without its GPU extras):
verl's own trainer code writes the rollout dump that `rollouts import --from verl` reads, and
verl's own `get_custom_reward_fn` loads the module `evotrainer export verl` writes and scores a
batch with it: the same rewards as our backtest worker gives the same completions."""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from evotrainer.api import SOURCE_REPORTED
from evotrainer.cli.main import app
from evotrainer.harness.repo import HarnessRepo
from evotrainer.store import Store
from evotrainer.workspace import Workspace

verl_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl is not installed (make setup installs it)")
verl_reward = pytest.importorskip("verl.trainer.ppo.reward")
omegaconf = pytest.importorskip("omegaconf")

ENV = {"COLUMNS": "200", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}
SECRET = "hunter2-Zq8Lp4Wx"

# Two prompts x two generations, as verl's GRPO step would dump them. The second generation of
# the first prompt is a reward hack verl's reward function paid for: score 1.0, a wrong answer.
INPUTS = ["What is 2 + 3?", "What is 2 + 3?", "What is 7 * 6?", "What is 7 * 6?"]
OUTPUTS = ["2 + 3 = 5. Answer: 5", "Answer: 6", "Answer: 42", "I am not sure"]
GTS = ["5", "5", "42", "42"]
SCORES = [1.0, 1.0, 1.0, 0.0]
EXTRA = {"acc": [True, True, True, False], "pred": ["5", "6", "42", ""]}


def verl_dump(folder: Path, step: int = 3, inputs=INPUTS, outputs=OUTPUTS, gts=GTS, scores=SCORES,
              extra=EXTRA) -> Path:
    """verl's own `RayPPOTrainer._dump_generations` (and the `_write_generations` it hands the
    write to) on a minimal trainer: just the attributes those two methods read."""
    trainer_cls = verl_trainer.RayPPOTrainer
    trainer = SimpleNamespace(global_steps=step, _write_generations=trainer_cls._write_generations)
    trainer._dump_executor, trainer._dump_futures = ThreadPoolExecutor(max_workers=1), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer_cls._dump_generations(trainer, inputs=list(inputs), outputs=list(outputs), gts=list(gts),
                                      scores=list(scores), reward_extra_infos_dict=dict(extra), dump_path=str(folder))
        trainer_cls._shutdown_dump_executor(trainer)
    return folder / f"{step}.jsonl"


def cli(*args: str):
    res = CliRunner().invoke(app, list(args), env=ENV)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def stored(workdir: Path) -> list:
    if not (workdir / "store.db").exists():
        return []
    with Store.open(workdir) as store:
        return list(store.iter_rollouts())


def test_verls_own_dump_imports_as_one_round_with_outcomes_rechecked_by_the_domain(tmp_path):
    dump = verl_dump(tmp_path / "rollout_data")
    assert json.loads(dump.read_text().splitlines()[0])["step"] == 3  # verl wrote it, not us
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "rollout_data"), "-w", str(work))
    assert res.exit_code == 0, res.output
    assert "imported 4 rollout(s) from verl into run 'verl' round 0" in res.stdout
    rows = stored(work)
    assert [sr.rollout.completion for sr in rows] == OUTPUTS
    assert [sr.reward for sr in rows] == SCORES  # verl's own score kept as the engine's reward
    assert all(sr.step == 3 for sr in rows)
    # the domain rechecked every completion: verl paid 1.0 for "Answer: 6", our check says wrong
    assert [sr.rollout.outcome.success for sr in rows] == [True, False, True, False]
    assert not any(SOURCE_REPORTED in sr.rollout.outcome.flags for sr in rows)
    assert {sr.rollout.meta["outcome_by"] for sr in rows} == {"domain:math"}
    assert rows[1].rollout.meta["verl"]["acc"] is True  # the source's fields, kept as they were
    groups = [sr.rollout.group_id for sr in rows]
    assert groups[0] == groups[1] != groups[2] == groups[3]  # repeated inputs of one step: one group
    # a second dump (the next step) is the run's next round; the same dump again is refused whole
    verl_dump(tmp_path / "next", step=4)
    assert "round 1" in cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "next" / "4.jsonl"),
                            "-w", str(work)).stdout
    again = cli("rollouts", "import", "--from", "verl", "--domain", "math", str(dump), "-w", str(work))
    assert again.exit_code == 2 and f"{dump}:1: already in the store" in again.stderr and len(stored(work)) == 8


def test_a_uid_in_the_reward_extra_info_is_the_group(tmp_path):
    extra = {**EXTRA, "uid": ["a", "b", "a", "b"]}
    verl_dump(tmp_path / "d", extra=extra)
    work = tmp_path / "work"
    assert cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "d"), "-w", str(work)).exit_code == 0
    groups = [sr.rollout.group_id for sr in stored(work)]
    assert groups[0] == groups[2] != groups[1] == groups[3]


def test_the_engines_correctness_field_is_stored_as_source_reported_and_every_report_says_so(tmp_path):
    verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "verl", "--domain", "math", "--outcome-field", "acc", str(tmp_path / "d"),
              "-w", str(work))
    assert res.exit_code == 0 and "source-reported" in res.stdout and "not verified" in res.stdout
    rows = stored(work)
    assert [sr.rollout.outcome.success for sr in rows] == EXTRA["acc"]  # the hack counts as a success here
    assert all(SOURCE_REPORTED in sr.rollout.outcome.flags for sr in rows)
    assert {sr.rollout.meta["outcome_by"] for sr in rows} == {"source:acc"}
    # diagnose, backtest and report on a workspace no trainer of ours ever ran in
    diag = cli("diagnose", "-w", str(work))
    assert diag.exit_code == 0, diag.output
    assert "4 of 4 rollouts are source-reported" in diag.stdout
    assert "source-reported" in next((work / "diagnostics").glob("*.md")).read_text()
    bt = cli("backtest", "main", "-w", str(work), "--json")
    assert bt.exit_code == 0, bt.output
    report = json.loads(bt.stdout)
    assert report["source_reported"] == 4 and report["n_rollouts"] == 4
    assert "4 of 4 rollouts have source-reported outcomes" in (work / "backtests" / f"{report['id']}.md").read_text()
    site = cli("report", "-w", str(work))
    assert site.exit_code == 0, site.output
    assert "4 source-reported" in (work / "report" / "index.html").read_text()


def test_the_domains_recheck_leaves_the_reports_unmarked(tmp_path):
    verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "d"), "-w", str(work))
    bt = cli("backtest", "main", "-w", str(work), "--json")
    assert bt.exit_code == 0 and json.loads(bt.stdout)["source_reported"] == 0


def _write(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join((json.dumps(x).encode() if isinstance(x, dict) else x) + b"\n" for x in lines))
    return path


def good(i: int, step: int = 2) -> dict:
    return {"input": f"What is {i} + 1? {SECRET}", "output": f"Answer: {i + 1}", "gts": str(i + 1), "score": 1.0,
            "step": step, "acc": True}


@pytest.mark.parametrize("case, expected", [
    ("truncated", "2.jsonl:2: invalid JSON"),
    ("missing", "2.jsonl:2: missing field(s): 'gts', 'score'"),
    ("mixed", "2.jsonl:2: step 3 differs from step 2 on line 1"),
    ("named", "2.jsonl:1: step 5 in a file named for step 2"),
    ("types", "2.jsonl:2: field 'output' must be a string"),
    ("outcome", "2.jsonl:2: field 'acc' (the --outcome-field) must be true/false or 1/0"),
])
def test_bad_dumps_are_one_clear_error_per_line_and_store_nothing(tmp_path, case, expected):
    folder = tmp_path / "dump"
    second = {"truncated": json.dumps(good(1)).encode()[:30],
              "missing": {k: v for k, v in good(1).items() if k not in ("gts", "score")},
              "mixed": good(1, step=3), "named": good(1), "types": {**good(1), "output": [SECRET]},
              "outcome": {**good(1), "acc": SECRET}}[case]
    first = good(0, step=5) if case == "named" else good(0)
    path = _write(folder / "2.jsonl", [first, second])
    if case == "truncated":  # cut mid-line, as a killed writer leaves it: no final newline
        path.write_bytes(path.read_bytes()[:-1])
    work = tmp_path / "work"
    extra = ["--outcome-field", "acc"] if case == "outcome" else []
    res = cli("rollouts", "import", "--from", "verl", "--domain", "math", *extra, str(folder), "-w", str(work))
    assert res.exit_code == 2, res.output
    assert expected in res.stderr, res.stderr
    assert "nothing imported" in res.stderr and SECRET not in res.output
    assert stored(work) == [] and not (work / "harnesses").exists()  # nothing made, nothing stored


def test_an_unknown_engine_or_no_domain_is_one_clear_error(tmp_path):
    dump = verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    res = cli("rollouts", "import", "--from", "openrlhf", "--domain", "math", str(dump), "-w", str(work))
    assert res.exit_code == 2 and "--from 'openrlhf': unknown engine; known: verl, verifiers" in res.stderr
    res = cli("rollouts", "import", "--from", "verl", str(dump), "-w", str(work))
    assert res.exit_code == 2 and "needs --domain" in res.stderr
    res = cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "nowhere"), "-w", str(work))
    assert res.exit_code == 2 and "no such file or folder" in res.stderr
    res = cli("rollouts", "import", "--from", "verl", "--domain", "math", "--skip-bad", str(dump), "-w", str(work))
    assert res.exit_code == 2 and "whole or not at all" in res.stderr
    res = cli("rollouts", "import", "--domain", "math", str(dump), "-w", str(work))  # our JSONL: no --domain
    assert res.exit_code == 2 and "--domain goes with --from" in res.stderr
    assert stored(work) == []


# ----------------------------------------------------------------------------- out


def promote(work: Path) -> str:
    """A harness change promoted on the imported rollouts: a format bonus of 0.25, a length penalty."""
    repo = HarnessRepo(Workspace(work).harnesses)
    spec = repo.sources("main")["harness.yaml"].replace("format: 0.1", "format: 0.25")
    reward = ('from evotrainer.api import Rollout\n\n\ndef reward(rollout: Rollout) -> dict[str, float]:\n'
              '    return {"correct": 1.0 if rollout.outcome.success else 0.0,\n'
              '            "format": 1.0 if rollout.outcome.kind in ("ok", "wrong") else 0.0,\n'
              '            "short": -0.01 * len(rollout.completion)}\n')
    cand = repo.propose(0, "format-and-length", {"harness.yaml": spec, "reward.py": reward}, diagnosis="d",
                        targets="proxy_auc", expected="e")
    return repo.promote(cand.branch, "test")


def backtest_worker_rewards(work: Path, rev: str) -> dict[str, float]:
    """The training reward our backtest replay worker gives each stored rollout under `rev`."""
    from evotrainer.backtest.replay_worker import ReplayJob
    from evotrainer.backtest.rows import ChunkReader
    from evotrainer.backtest.selector import Selector, plan_chunks, resolve
    from evotrainer.harness.loader import parse_spec
    from evotrainer.harness.sandbox import SandboxLimits, SandboxPool

    sources = HarnessRepo(Workspace(work).harnesses).sources(rev)
    weights = parse_spec(sources["harness.yaml"]).reward_weights
    with Store.open(work) as store:
        selection = resolve(store, Selector())
        reader = ChunkReader(store, selection.scope)
        messages = [("groups", reader.read(chunk)[0]) for chunk in plan_chunks(store, selection, 4096)]
    out: dict[str, float] = {}
    with SandboxPool([("candidate", sources)], ReplayJob(), 1, SandboxLimits()) as pool:
        for _, reply in pool.imap(messages):
            for rid, comps in zip(reply["ids"], reply["rewards"]):
                out[rid] = sum(weights.get(k, 1.0) * v for k, v in comps.items())
    return out


def test_verls_loader_scores_the_exported_harness_as_our_backtest_worker_does(tmp_path):
    verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    assert cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "d"), "-w", str(work)).exit_code == 0
    merged = promote(work)
    out = tmp_path / "exported_reward.py"
    res = cli("export", "verl", "--workdir", str(work), "--rev", "main", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert f"HARNESS_COMMIT = {merged!r}" in out.read_text()  # the commit it came from
    config = omegaconf.OmegaConf.create({"reward": {"custom_reward_function": {"path": str(out), "name": "compute_score"}}})
    one = verl_reward.get_custom_reward_fn(config)  # verl's own loader
    config.reward.custom_reward_function.name = "compute_score_batch"
    batch = verl_reward.get_custom_reward_fn(config)
    per_sample = [one("math", o, g, {}) for o, g in zip(OUTPUTS, GTS)]
    batched = batch(["math"] * 4, OUTPUTS, GTS, [{}] * 4)
    assert [r["score"] for r in per_sample] == [r["score"] for r in batched]
    assert [r["acc"] for r in batched] == [True, False, True, False]  # the domain's check, not verl's score
    ours = backtest_worker_rewards(work, "main")
    by_completion = {sr.rollout.completion: ours[sr.rollout.id] for sr in stored(work)}
    assert [r["score"] for r in batched] == pytest.approx([by_completion[o] for o in OUTPUTS], abs=1e-12)
    # and the promoted change is what scored them: 0.25 for the format, a penalty per character
    assert batched[0]["score"] == pytest.approx(1.0 + 0.25 - 0.01 * len(OUTPUTS[0]))


def test_the_exported_harness_runs_only_in_a_sandbox_worker(tmp_path):
    """A harness that reaches for the file system: inside verl's loader it fails as it would in our
    trainer (the sandbox refuses), instead of running with the user's process's power."""
    verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "d"), "-w", str(work))
    repo = HarnessRepo(Workspace(work).harnesses)
    marker = tmp_path / "escaped.txt"
    evil = ('from evotrainer.api import Rollout\n\n\ndef reward(rollout: Rollout) -> dict[str, float]:\n'
            f'    open({str(marker)!r}, "w").write("x")\n    return {{"correct": 1.0}}\n')
    cand = repo.propose(0, "evil", {"reward.py": evil}, diagnosis="d", targets="proxy_auc", expected="e")
    out = tmp_path / "evil_reward.py"
    assert cli("export", "verl", "--workdir", str(work), "--rev", cand.branch, "-o", str(out)).exit_code == 0
    config = omegaconf.OmegaConf.create({"reward": {"custom_reward_function": {"path": str(out), "name": "compute_score"}}})
    fn = verl_reward.get_custom_reward_fn(config)
    from evotrainer.harness.loader import HarnessError

    with pytest.raises(HarnessError):
        fn("math", "Answer: 5", "5", {})
    assert not marker.exists()


def test_a_branch_name_cannot_inject_code_into_the_exported_module(tmp_path):
    """Git allows quotes in branch names: a candidate named to close the module's docstring and
    run code in verl's process when verl loads the export. The name is written quote-free."""
    import ast
    import subprocess

    verl_dump(tmp_path / "d")
    work = tmp_path / "work"
    cli("rollouts", "import", "--from", "verl", "--domain", "math", str(tmp_path / "d"), "-w", str(work))
    marker = tmp_path / "injected.txt"
    name = f'candidate/0-x"""+__import__("pathlib").Path("{marker}").touch()+"""'  # no space: a valid ref
    subprocess.run(["git", "-C", str(work / "harnesses"), "branch", name, "main"], check=True, capture_output=True)
    out = tmp_path / "reward.py"
    assert cli("export", "verl", "--workdir", str(work), "--rev", name, "-o", str(out)).exit_code == 0
    tree = ast.parse(out.read_text())
    assert [type(n).__name__ for n in tree.body[:1]] == ["Expr"]  # the docstring, still one string
    assert not any(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) for n in tree.body)
    config = omegaconf.OmegaConf.create({"reward": {"custom_reward_function": {"path": str(out), "name": "compute_score"}}})
    verl_reward.get_custom_reward_fn(config)  # verl imports the module
    assert not marker.exists()
