"""The standard probe library (evotrainer.api.probes): harness code may import it, and that grants
harness code nothing. Attacks: a callback handed to the library that imports what a harness may
not, from inside a real sandbox worker; and a static read of the package for anything but pure
computation. Also the trainer side that feeds the model-state probes (the real GRPO steps that
check it against TRL's logs are in tests/test_train.py)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import evotrainer.api
from evotrainer.diagnose import health_report
from evotrainer.harness.isolated import IsolatedHarness
from evotrainer.harness.loader import HarnessError, check_imports, is_api_module, load_harness, read_sources
from evotrainer.harness.sandbox import ALLOWED_MODULES
from evotrainer.paths import HARNESSES_DIR
from evotrainer.sandbox import isolation_support
from tests.probe_batches import steps_batch, swe_batch, varied_batch

API = Path(evotrainer.api.__file__).parent
SEEDS = ("math", "code", "swe")
# Builtins through which code reaches files, other modules or the interpreter's internals.
IMPURE = {"open", "__import__", "exec", "eval", "compile", "globals", "vars", "input", "breakpoint"}


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("path", sorted(API.glob("*.py")), ids=lambda p: p.name)
def test_the_api_package_imports_only_what_harness_code_may(path: Path) -> None:
    source = path.read_text()
    check_imports(source, path.name)  # the loader's check of a harness file
    tree = ast.parse(source)
    for name in _imports(tree):  # and the worker's stricter list
        assert name in ALLOWED_MODULES or is_api_module(name), f"{path.name} imports {name}"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & IMPURE
    assert not used, f"{path.name} calls {sorted(used)}"


@pytest.mark.parametrize("seed", SEEDS)
def test_each_seed_takes_its_standard_probes_from_the_library(seed: str) -> None:
    from evotrainer.api import probes

    harness = load_harness(HARNESSES_DIR / seed)
    shared = [p for p in harness.probes if hasattr(probes, p.name)]
    assert len(shared) == 19 and all(p.fn is getattr(probes, p.name) for p in shared)
    assert "mean_kl" not in {p.name for p in shared}  # the seeds' beta is 0: it would always be n/a
    own = {p.name for p in harness.probes} - {p.name for p in shared}
    assert own == ({"empty_patch_rate", "timeout_rate", "partial_rate"} if seed == "swe" else set())
    report = health_report(harness, varied_batch())
    assert all(p.value is not None for p in report.probes), [p.name for p in report.probes if p.value is None]


def test_entropy_fall_tells_a_collapsing_learning_rate_from_ordinary_training() -> None:
    from evotrainer.api.probes import entropy_fall
    from evotrainer.faultbench.run import read_round
    from evotrainer.paths import FAULT_CASES_DIR

    assert entropy_fall(steps_batch(), []) == pytest.approx(1 - (2.0 + 1.0) / 2 / 2.0)
    assert entropy_fall(steps_batch()[:6], []) is None  # three steps: too few to tell a trend
    harness = load_harness(HARNESSES_DIR / "math")
    warn = next(p.warn for p in harness.probes if p.name == "entropy_fall")
    # The real rollouts of the fault cases: only the 25x learning rate loses that much that fast.
    falls = {}
    for case in sorted(FAULT_CASES_DIR.glob("math-*")):
        rows = read_round(sorted((case / "rollouts").glob("round-*"))[-1], "math")
        report = health_report(harness, rows)  # the diagnose stage's path: the store's step reaches the probe
        falls[case.name] = next(p.value for p in report.probes if p.name == "entropy_fall")
    assert falls.pop("math-lr-collapse") > warn, falls
    assert all(v is None or v < warn for v in falls.values()), falls


needs_sandbox = pytest.mark.skipif(
    not all(isolation_support().get(k) for k in ("netns", "mountns", "pidns")),
    reason="no user namespaces here: harness workers refuse to start")


def _with_probe(body: str) -> dict[str, str]:
    sources = read_sources(HARNESSES_DIR / "math")
    sources["diagnostics.py"] += "\n\n" + body + '\n\nPROBES.append(probe("sneak", "result", sneak, 0.5, 0.9, "above"))\n'
    return sources


@needs_sandbox
def test_the_library_is_importable_in_a_sandbox_worker_and_gives_the_in_process_values() -> None:
    rollouts = varied_batch()
    with IsolatedHarness(read_sources(HARNESSES_DIR / "swe"), HARNESSES_DIR / "swe") as isolated:
        sandboxed = health_report(isolated, rollouts).to_json()
    in_process = health_report(load_harness(HARNESSES_DIR / "swe"), rollouts).to_json()
    assert sandboxed == in_process


@needs_sandbox
def test_a_callback_into_the_library_borrows_no_import_rights() -> None:
    # A function built with bare globals takes the import verdict of its nearest module caller:
    # called from probes.share, that must not be a trusted module of ours.
    sources = _with_probe('''
from evotrainer.api.probes import share


def sneak(rollouts, rewards):
    hit = eval("lambda r: __import__('os').getpid() > 0", {"__builtins__": __builtins__})
    return share(rollouts, hit)
''')
    with IsolatedHarness(sources, HARNESSES_DIR / "math") as harness:
        with pytest.raises(HarnessError, match="attempted import of 'os'"):
            harness.probe_values(swe_batch(), [0.0] * 10)


@needs_sandbox
def test_changing_the_library_in_a_worker_reaches_no_other_process() -> None:
    # One harness rewrites the library in its worker; a second harness's worker and this
    # process still compute the true values.
    sources = _with_probe('''
import evotrainer.api.probes as _probes


def sneak(rollouts, rewards):
    _probes.success_rate.__code__ = (lambda rollouts, rewards: 0.987).__code__
    return 0.0
''')
    rollouts = swe_batch()
    with IsolatedHarness(sources, HARNESSES_DIR / "math") as hostile, \
            IsolatedHarness(read_sources(HARNESSES_DIR / "math"), HARNESSES_DIR / "math") as honest:
        values = hostile.probe_values(rollouts, [0.0] * 10)
        assert values["sneak"] == 0.0
        assert honest.probe_values(rollouts, [0.0] * 10)["success_rate"] == pytest.approx(0.1)
    assert load_harness(HARNESSES_DIR / "math").probe_values(rollouts, [0.0] * 10)["success_rate"] == pytest.approx(0.1)


# ---------------------------------------------------------------- the trainer's side


def test_the_loss_makes_the_one_pass_the_trainer_measures():
    # HarnessGRPOTrainer keeps the per-token values of the call with compute_entropy=True that
    # GRPOTrainer._compute_loss makes; in the pinned TRL it is that method's only such call.
    from trl import GRPOTrainer

    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert loss.count("self._get_per_token_logps_and_entropies(") == 1 and "compute_entropy=True" in loss
    assert "compute_entropy=True" not in inspect.getsource(GRPOTrainer._generate_and_score_completions)


def test_row_means_count_only_the_loss_tokens():
    import torch

    from evotrainer.train.sample_stats import row_means

    logps = torch.tensor([[-1.0, -3.0, -9.0], [-2.0, -2.0, -2.0], [-0.5, -0.5, -0.5]])
    entropies = torch.tensor([[1.0, 2.0, 9.0], [0.5, 0.5, 0.5], [3.0, 3.0, 3.0]])
    inputs = {"completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]]),
              "tool_mask": torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 1]])}
    rows = row_means(logps, entropies, inputs)
    assert rows[0] == {"mean_logprob": -2.0, "entropy": 1.5}  # the padding after the end is out
    assert rows[1] == {"mean_logprob": -2.0, "entropy": 0.5}  # and the environment's tokens
    assert rows[2] == {}  # a row out of the loss (a filter dropped it)
    ref = logps + torch.tensor([[0.1, 0.1, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rows = row_means(logps, entropies, {**inputs, "ref_per_token_logps": ref})
    k3 = torch.exp(torch.tensor(0.1)) - 0.1 - 1  # TRL's estimator of its KL term
    assert rows[0]["kl"] == pytest.approx(float(k3)) and rows[1]["kl"] == 0.0 and "kl" not in rows[2]
