"""A domain from a package of its own, installed editable into this venv: found by its entry point
and by its package.module:factory path, and run end to end by train, eval, coevolve and grade,
from the command line with no config file of its own (configs/default.yaml and the generic seed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.config import load_config
from evotrainer.domains import DomainError, build, resolve
from evotrainer.paths import HARNESSES_DIR

PLUGIN = '''
"""Echo domain: say the word back. A plugin for evotrainer's tests."""

from evotrainer.api import Outcome
from evotrainer.domains import Task

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "delta", "ember",
         "frost", "grape", "honey", "ivory", "jolly", "koala"]


class EchoDomain:
    """Echo one word back; exact match on the first word of the reply."""

    name = "echo"

    def __init__(self, times: int = 1) -> None:
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times}")
        self.times = times

    def _task(self, i: int) -> Task:
        word = WORDS[i]
        return Task(task_id=f"echo-{word}", domain=self.name, split="heldout" if i % 4 == 0 else "train",
                    level=0, prompt=f"Say the word {word!r} {self.times} time(s) and nothing else.",
                    answer=" ".join([word] * self.times))

    def all_tasks(self) -> list[Task]:
        return [self._task(i) for i in range(len(WORDS))]

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        pool = [t for t in self.all_tasks() if t.split == split]
        pool = pool[seed % len(pool):] + pool[:seed % len(pool)]
        return pool[:n]

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        words = completion.replace("'", " ").replace('"', " ").split()
        if not words:
            return Outcome(False, 0.0, "empty")
        got = " ".join(words[: self.times]).strip(".,!").lower()
        return Outcome(got == task.answer, float(got == task.answer), "ok" if got == task.answer else "wrong")


def make(**options) -> EchoDomain:
    return EchoDomain(**options)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "evoplug-echo"
version = "0.0.1"

[project.entry-points."evotrainer.domains"]
echo = "evoplug_echo.tasks:make"

[tool.setuptools.packages.find]
include = ["evoplug_echo*"]
'''

EVOTRAINER = [sys.executable, "-m", "evotrainer"]
SMALL = ["domain.train_size=3", "domain.heldout_size=2", "train.prompts_per_step=1", "eval.batch_size=8"]


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True,
                   timeout=300)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The plugin package, pip-installed editable (its entry point registered) for this module."""
    root = tmp_path_factory.mktemp("evoplug")
    (root / "evoplug_echo").mkdir()
    (root / "evoplug_echo" / "__init__.py").write_text("")
    (root / "evoplug_echo" / "tasks.py").write_text(PLUGIN)
    (root / "pyproject.toml").write_text(PYPROJECT)
    _pip("install", "--no-deps", "--no-build-isolation", "-e", str(root))
    sys.path.insert(0, str(root))  # this process saw site-packages before the install
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        _pip("uninstall", "-y", "evoplug-echo")


def _cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([*EVOTRAINER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"evotrainer {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_the_entry_point_and_the_module_path_both_resolve(plugin, tmp_path):
    listed = json.loads(_cli("domains", "--json", cwd=tmp_path).stdout)
    echo = next(r for r in listed if r["name"] == "echo")
    assert echo["kind"] == "entry point" and echo["target"] == "evoplug_echo.tasks:make"
    assert echo["seed_harness"] == "generic" and echo["error"] is None
    assert resolve("evoplug_echo.tasks:make").kind == "module path"
    assert resolve("echo").seed_harness() == HARNESSES_DIR / "generic"
    # domain.options reach the factory; a wrong one is named, and so is a common key it does not take.
    cfg = load_config(None, ["domain.options.times=2"], domain="echo")
    assert cfg.domain.name == "echo" and cfg.harness_dir() == HARNESSES_DIR / "generic"
    assert build("echo", {}, {"times": 2}).tasks("train", 1, 0)[0].answer.count(" ") == 1
    # make(**options) hands everything on, so the class's own TypeError names the key.
    with pytest.raises(DomainError, match="unexpected keyword argument 'nope'"):
        build("echo", {}, {"nope": 1})
    with pytest.raises(DomainError, match="does not take domain.source"):
        build("evoplug_echo.tasks:EchoDomain", {"source": "x.jsonl"}, {})
    with pytest.raises(DomainError, match="has no option 'nope' \\(its options: times\\)"):
        build("evoplug_echo.tasks:EchoDomain", {}, {"nope": 1})
    with pytest.raises(DomainError, match="times must be >= 1"):
        build("evoplug_echo.tasks:make", {}, {"times": 0})
    with pytest.raises(DomainError, match="no 'missing'"):
        resolve("evoplug_echo.tasks:missing")


def test_grade_scores_outputs_with_the_plugins_check(plugin, tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(p) for p in [
        {"task_id": "echo-apple", "completion": "apple"},
        {"task_id": "echo-river", "completion": "River."},
        {"task_id": "echo-stone", "completion": "pebble"},
        {"task_id": "echo-cloud", "completion": ""},
    ]) + "\n")
    out = json.loads(_cli("grade", "--domain", "echo", "--predictions", str(preds), "--json", cwd=tmp_path).stdout)
    assert out["summary"]["successes"] == 2 and out["summary"]["kinds"] == {"ok": 2, "wrong": 1, "empty": 1}
    assert [r["outcome"]["success"] for r in out["results"]] == [True, True, False, False]
    assert out["summary"]["tasks_without_prediction"] == 12
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task_id": "echo-nothing", "completion": "x"}) + "\n")
    proc = subprocess.run([*EVOTRAINER, "grade", "--domain", "echo", "--predictions", str(bad)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "name no task of domain 'echo': echo-nothing" in proc.stderr


def _small_generic_seed(tmp_path: Path) -> Path:
    """The generic seed with 4 generations of at most 8 tokens: the same files, a cheaper step."""
    seed = tmp_path / "generic-small"
    shutil.copytree(HARNESSES_DIR / "generic", seed)
    spec = seed / "harness.yaml"
    spec.write_text(spec.read_text().replace("num_generations: 8", "num_generations: 4")
                    .replace("max_completion_length: 64", "max_completion_length: 8"))
    return seed


@pytest.mark.slow
def test_train_eval_and_coevolve_run_a_plugin_domain_from_the_command_line(plugin, tmp_path):
    small = [*SMALL, f"harness={_small_generic_seed(tmp_path)}"]
    work = tmp_path / "work"
    _cli("train", "--domain", "echo", "--steps", "1", "--rounds", "1", "--workdir", str(work), *small, cwd=tmp_path)
    from evotrainer.store import Store

    store = Store.open(work)
    assert store.count_rollouts(domain="echo") == 4  # one step: one prompt x num_generations 4
    assert {t["task_id"] for t in store.tasks("echo")} >= {"echo-apple", "echo-river"}
    assert any((work / "adapters").iterdir())
    # The workspace records the domain; its harness repo starts from the generic seed's files.
    assert "for any domain" in (work / "harnesses" / "reward.py").read_text()

    proc = _cli("eval", "--domain", "evoplug_echo.tasks:make", "--workdir", str(tmp_path / "eval"), "--json",
                *small, cwd=tmp_path)
    result = json.loads(proc.stdout)["results"][0]
    assert result["n"] == 2 and sum(result["kinds"].values()) == 2

    co = tmp_path / "co"
    proc = _cli("coevolve", "--domain", "echo", "--rounds", "1", "--workdir", str(co), "train.steps_per_round=1",
                *small, cwd=tmp_path)
    # It ends with the run as a whole: each round, what was promoted, and where to look next.
    assert "co-evolution run 'default': 1 round(s)" in proc.stdout and "skills learned:" in proc.stdout
    assert f"report: evotrainer report --workdir {co}" in proc.stdout
    state = json.loads((co / "coevolve.json").read_text())
    assert state["domain"] == "echo" and len(state["history"]) == 1
    # The report and the skill library take the plugin's workspace like any other.
    _cli("report", "--workdir", str(co), cwd=tmp_path)
    assert "echo" in (co / "report" / "index.html").read_text()
    listed = _cli("skills", "list", "--domain", "echo", cwd=tmp_path).stdout
    assert "pass-rate-curriculum" in listed and "edit-then-test" not in listed


def test_a_domain_that_fails_to_build_leaves_no_workspace(tmp_path):
    from evotrainer.train.loop import open_session

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "prompt": "2 + 2?", "answer": "4"}\n{"task_id": "a", "prompt": "x", "answer": "y"}\n')
    cfg = load_config(None, [f"domain.source={bad}", "domain.options.verifier=numeric"], domain="tasks")
    with pytest.raises(DomainError, match="bad.jsonl:2"):
        open_session(cfg, tmp_path / "work")
    cfg = load_config(None, [], domain="collections:OrderedDict")  # builds, but is no domain
    with pytest.raises(DomainError, match="returned OrderedDict, which lacks name"):
        open_session(cfg, tmp_path / "work")
    assert not (tmp_path / "work").exists()
