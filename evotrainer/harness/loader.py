"""Load a harness folder into validated hooks; any harness fault becomes a HarnessError.

Harness code is untrusted. Every call into it goes through `_call` (an exception becomes a
HarnessError naming the file and function) and every value it returns through a `validate_*`
function, so the same checks can run in a sandboxed worker and again on the values it sends back.
Each file is compiled and run as its own module under a unique name, so several harness versions
can live side by side in one process, and no `__pycache__` is written into the harness repo.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from evotrainer.api import Rollout, TaskStats, Turn
from evotrainer.harness.errors import HarnessError

# harness.yaml lives in spec.py; its names stay importable from here
from evotrainer.harness.spec import (  # noqa: F401
    GRPO_KEYS,
    LOSS_TYPES,
    RATIO_CLIP_LOSSES,
    SCALE_REWARDS,
    SPEC_FILE,
    HarnessSpec,
    parse_spec,
)

# file -> the functions (or values) it must define
CODE_FILES: dict[str, tuple[str, ...]] = {
    "reward.py": ("reward",),
    "filters.py": ("keep_rollout", "keep_group"),
    "curriculum.py": ("weights",),
    "rollout.py": ("PROMPT", "stop"),
    "diagnostics.py": ("PROBES",),
}
HARNESS_FILES = (SPEC_FILE, *CODE_FILES)
DIMENSIONS = ("result", "behaviour", "efficiency", "model_state", "test_structure")
API_PACKAGE = "evotrainer.api"  # every module in it is harness-facing: it imports what harness code may
DIRECTIONS = ("above", "below")


# ---------------------------------------------------------------- return-value validators


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# No honest reward comes near this. Every training reward (the weighted sum of a reward's
# components) stays within it, in training and in the backtest alike (whose parent also bounds
# each component), so whatever a step or a metric makes of a batch of them (sums, squares, group
# std, advantages) stays finite: 1e308 is finite, yet two of them sum to inf, and a GRPO step
# would learn nothing, silently.
REWARD_BOUND = 1e9


def validate_reward(value: Any) -> dict[str, float]:
    where = "reward.py: reward()"
    if not isinstance(value, dict):
        raise HarnessError(f"{where} returned {type(value).__name__}, expected dict[str, float]")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise HarnessError(f"{where} returned a {type(key).__name__} key {key!r}, expected str")
        if not _real(item) or not math.isfinite(float(item)):
            raise HarnessError(f"{where} returned {key!r}: {item!r}, expected a finite float")
        out[key] = float(item)
    return out


def validate_training_reward(value: float, components: Mapping[str, float]) -> float:
    """A training reward (the weighted sum of `components`): finite and within REWARD_BOUND."""
    if not -REWARD_BOUND <= value <= REWARD_BOUND:
        raise HarnessError(f"reward.py: the training reward (weighted sum of {dict(components)}) is {value:g}, "
                           f"expected a finite float within +-{REWARD_BOUND:g}")
    return value


def validate_bool(value: Any, where: str) -> bool:
    """`where` is e.g. "filters.py: keep_rollout()". numpy's bool_ counts as a bool."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise HarnessError(f"{where} returned {type(value).__name__}, expected bool")


def validate_weights(value: Any, task_ids: Sequence[str]) -> dict[str, float]:
    """One non-negative finite weight per task id; a task the curriculum leaves out weighs 1.0."""
    where = "curriculum.py: weights()"
    if not isinstance(value, dict):
        raise HarnessError(f"{where} returned {type(value).__name__}, expected dict[str, float]")
    known = set(task_ids)
    out = {task_id: 1.0 for task_id in task_ids}
    for key, item in value.items():
        if key not in known:
            raise HarnessError(f"{where} returned a weight for unknown task id {key!r}")
        if not _real(item) or not math.isfinite(float(item)) or float(item) < 0:
            raise HarnessError(f"{where} returned {key!r}: {item!r}, expected a finite float >= 0")
        out[key] = float(item)
    if out and not any(out.values()):
        raise HarnessError(f"{where} gave every task weight 0")
    if not math.isfinite(sum(out.values())):  # each finite, yet a draw over them would divide by inf
        raise HarnessError(f"{where} returned weights whose sum overflows: scale them down")
    return out


def validate_stop(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise HarnessError(f"rollout.py: stop() returned {value!r}, expected a non-empty str or None")


def validate_probe_value(value: Any, name: str) -> float | None:
    """A finite float, or None: "not measurable on these rollouts" (e.g. turns of single-turn ones)."""
    if value is None:
        return None
    if not _real(value) or not math.isfinite(float(value)):
        raise HarnessError(f"diagnostics.py: probe {name}() returned {value!r}, expected a finite float or None")
    return float(value)


# ---------------------------------------------------------------- probes


@dataclass(frozen=True)
class Probe:
    """A diagnostic: fn(rollouts, rewards) -> float, alerting past warn/critical in `direction`."""

    name: str
    dimension: str
    warn: float
    critical: float
    direction: str
    fn: Callable[[Sequence[Rollout], Sequence[float]], float]

    def evaluate(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> float | None:
        value = _call("diagnostics.py", f"probe {self.name}", self.fn, tuple(rollouts), tuple(rewards))
        return validate_probe_value(value, self.name)

    def level(self, value: float | None) -> str:
        """"ok", "warn" or "critical" for a value of this probe; "n/a" for None."""
        if value is None:
            return "n/a"
        past = (lambda t: value > t) if self.direction == "above" else (lambda t: value < t)
        return "critical" if past(self.critical) else "warn" if past(self.warn) else "ok"


def validate_probes(value: Any) -> list[Probe]:
    """PROBES: a list of dicts (or objects with the same attributes) -> Probe list."""
    where = "diagnostics.py: PROBES"
    if not isinstance(value, (list, tuple)):
        raise HarnessError(f"{where} is {type(value).__name__}, expected a list of probes")
    probes, names = [], set()
    for i, item in enumerate(value):
        get = item.get if isinstance(item, dict) else lambda k, it=item: getattr(it, k, None)
        name = get("name")
        label = f"{where}[{i}]" + (f" ({name})" if isinstance(name, str) else "")
        if not isinstance(name, str) or not name:
            raise HarnessError(f"{label}: name must be a non-empty string")
        if name in names:
            raise HarnessError(f"{label}: duplicate probe name")
        names.add(name)
        if get("dimension") not in DIMENSIONS:
            raise HarnessError(f"{label}: dimension must be one of {', '.join(DIMENSIONS)}, got {get('dimension')!r}")
        if get("direction") not in DIRECTIONS:
            raise HarnessError(f"{label}: direction must be 'above' or 'below', got {get('direction')!r}")
        if not callable(get("fn")):
            raise HarnessError(f"{label}: fn must be callable(rollouts, rewards) -> float")
        for key in ("warn", "critical"):
            if not _real(get(key)) or not math.isfinite(float(get(key))):
                raise HarnessError(f"{label}: {key} must be a finite number, got {get(key)!r}")
        warn, critical = float(get("warn")), float(get("critical"))
        if (critical < warn) if get("direction") == "above" else (critical > warn):
            raise HarnessError(f"{label}: critical {critical:g} is milder than warn {warn:g}")
        probes.append(Probe(name, get("dimension"), warn, critical, get("direction"), get("fn")))
    return probes


# ---------------------------------------------------------------- loading code


def _call(filename: str, func: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call harness code; any exception (or sys.exit) becomes a HarnessError naming file and function."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as exc:
        raise HarnessError(f"{filename}: {func}() raised {type(exc).__name__}: {exc}") from exc


def is_api_module(module: str) -> bool:
    """Whether `module` is of the evotrainer.api package (the contract and the standard probes),
    the only part of evotrainer harness code may import."""
    return module == API_PACKAGE or module.startswith(API_PACKAGE + ".")


def _allowed_import(module: str) -> bool:
    top = module.split(".")[0]
    if top == "evotrainer":
        return is_api_module(module)
    return top == "numpy" or top in sys.stdlib_module_names


def check_imports(source: str, filename: str) -> None:
    """Reject imports beyond evotrainer.api (and its evotrainer.api.probes), numpy and the
    standard library (static check only; a sandboxed worker is what stops `__import__` tricks)."""
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError) as exc:
        raise HarnessError(f"{filename}: syntax error{_line(exc)}: {_msg(exc)} ({_needs(filename)})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise HarnessError(f"{filename}: relative import at line {node.lineno} is not allowed")
            base = node.module or ""
            names = [f"{base}.{a.name}" if base == "evotrainer" else base for a in node.names]
        else:
            continue
        for name in names:
            if not _allowed_import(name):
                raise HarnessError(
                    f"{filename}: import of {name!r} at line {node.lineno} is not allowed "
                    "(harness files import only evotrainer.api, evotrainer.api.probes, numpy and the "
                    "standard library)"
                )


def _line(exc: Exception) -> str:
    lineno = getattr(exc, "lineno", None)
    return f" at line {lineno}" if lineno else ""


def _msg(exc: Exception) -> str:
    return getattr(exc, "msg", None) or str(exc)


def _needs(filename: str) -> str:
    return "defines " + ", ".join(n if n.isupper() else f"{n}()" for n in CODE_FILES[filename])


_module_ids = itertools.count()


def _exec_module(filename: str, source: str, path: Path, version: str) -> ModuleType:
    check_imports(source, filename)
    try:
        code = compile(source, str(path / filename), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise HarnessError(f"{filename}: syntax error{_line(exc)}: {_msg(exc)} ({_needs(filename)})") from None
    name = f"_evoharness_{version}_{next(_module_ids)}_{filename[:-3]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    module.__file__ = str(path / filename)
    # Registered while it runs (dataclasses look their module up); dropped after, so reloading
    # many versions does not grow sys.modules.
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        raise HarnessError(
            f"{filename}: loading the module ({_needs(filename)}) raised {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        sys.modules.pop(name, None)
    return module


def _attr(module: ModuleType, filename: str, name: str) -> Any:
    if not hasattr(module, name):
        what = name if name.isupper() else f"{name}()"
        raise HarnessError(f"{filename}: {what} is not defined")
    value = getattr(module, name)
    if not name.isupper() and not callable(value):
        raise HarnessError(f"{filename}: {name} is {type(value).__name__}, expected a function {name}()")
    return value


def prompt_template(source: str) -> str:
    """rollout.py's PROMPT, read from its text without running it: one top-level assignment of a
    string literal, which no other statement rebinds. The trusted side renders prompts from this
    string (harness/prompts.py), so nothing rollout.py does at run time can change a prompt."""
    filename = "rollout.py"
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError) as exc:
        raise HarnessError(f"{filename}: syntax error{_line(exc)}: {_msg(exc)} ({_needs(filename)})") from None
    assigned = [node for node in tree.body
                if (isinstance(node, ast.Assign) and len(node.targets) == 1 and _is_prompt(node.targets[0]))
                or (isinstance(node, ast.AnnAssign) and _is_prompt(node.target) and node.value is not None)]
    if not assigned:
        raise HarnessError(f"{filename}: PROMPT is not defined (a top-level PROMPT = \"...\" template string)")
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "PROMPT" and isinstance(n.ctx, ast.Store)]
    value = assigned[0].value
    if len(assigned) > 1 or len(stores) > 1 or any(_rebinds_prompt(n) for n in ast.walk(tree)):
        raise HarnessError(f"{filename}: PROMPT is assigned more than once; the trusted side reads it as data, "
                           "so it must be one top-level string literal")
    if not isinstance(value, ast.Constant):
        raise HarnessError(f"{filename}: PROMPT must be a string literal (line {value.lineno}): the trusted side "
                           "reads the template as data, without running rollout.py")
    if not isinstance(value.value, str):
        raise HarnessError(f"{filename}: PROMPT is {type(value.value).__name__}, expected a Jinja template string")
    return value.value


def _is_prompt(target: ast.AST) -> bool:
    return isinstance(target, ast.Name) and target.id == "PROMPT"


def _rebinds_prompt(node: ast.AST) -> bool:
    """`global PROMPT`, `globals()["PROMPT"] = ...`, `setattr(..., "PROMPT", ...)` and the like."""
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return "PROMPT" in node.names
    return isinstance(node, ast.Constant) and node.value == "PROMPT"


def harness_version(sources: Mapping[str, str]) -> str:
    """sha256 of the harness files (names and contents), 12 hex chars."""
    digest = hashlib.sha256()
    for filename in HARNESS_FILES:
        digest.update(filename.encode() + b"\0" + sources[filename].encode("utf-8") + b"\0")
    return digest.hexdigest()[:12]


def weighted_reward(weights: Mapping[str, float], components: Mapping[str, float]) -> float:
    """The training reward: the weighted sum of reward components (a component without a weight
    counts 1.0). Plain arithmetic, so trusted code applies it to values a worker returned."""
    return float(sum(weights.get(name, 1.0) * value for name, value in components.items()))


# ---------------------------------------------------------------- the harness


class Harness:
    """A loaded harness: validated calls into its reward, filters, curriculum, rollout rules and probes."""

    def __init__(self, sources: Mapping[str, str], path: Path, version: str | None = None) -> None:
        """`version` names this harness in the store (a commit sha when loaded from the harness
        repo); default: a content hash of the harness files."""
        self.path = Path(path)
        self.spec = parse_spec(sources[SPEC_FILE])
        self.version = version or harness_version(sources)
        modules = {f: _exec_module(f, sources[f], self.path, self.version) for f in CODE_FILES}
        self._reward = _attr(modules["reward.py"], "reward.py", "reward")
        self._keep_rollout = _attr(modules["filters.py"], "filters.py", "keep_rollout")
        self._keep_group = _attr(modules["filters.py"], "filters.py", "keep_group")
        self._weights = _attr(modules["curriculum.py"], "curriculum.py", "weights")
        self._stop = _attr(modules["rollout.py"], "rollout.py", "stop")
        prompt = prompt_template(sources["rollout.py"])  # the text, whatever the module did at import
        try:
            env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
            self._template = env.from_string(prompt)
        except TemplateError as exc:
            raise HarnessError(f"rollout.py: PROMPT is not a valid Jinja template: {exc}") from None
        self.prompt_source = prompt
        self.probes: list[Probe] = validate_probes(_attr(modules["diagnostics.py"], "diagnostics.py", "PROBES"))

    def __repr__(self) -> str:
        return f"Harness({str(self.path)!r}, version={self.version!r})"

    def reward(self, rollout: Rollout) -> dict[str, float]:
        return validate_reward(_call("reward.py", "reward", self._reward, rollout))

    def training_reward(self, components: Mapping[str, float]) -> float:
        """The weighted sum of reward components; a component without a weight counts 1.0."""
        return weighted_reward(self.spec.reward_weights, components)

    def rewards(self, rollouts: Sequence[Rollout]) -> list[dict[str, float]]:
        """reward() of each rollout (the batched form IsolatedHarness sends in one message)."""
        return [self.reward(r) for r in rollouts]

    def filters(self, groups: Sequence[tuple[Sequence[Rollout], Sequence[float]]]) -> list[list[bool]]:
        """Per group, each rollout's kept flag: keep_group() and, for a kept group, keep_rollout()."""
        out = []
        for rollouts, rewards in groups:
            group = self.keep_group(rollouts, rewards)
            out.append([group and self.keep_rollout(r) for r in rollouts])
        return out

    def keep_rollout(self, rollout: Rollout) -> bool:
        value = _call("filters.py", "keep_rollout", self._keep_rollout, rollout)
        return validate_bool(value, "filters.py: keep_rollout()")

    def keep_group(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> bool:
        value = _call("filters.py", "keep_group", self._keep_group, tuple(rollouts), tuple(rewards))
        return validate_bool(value, "filters.py: keep_group()")

    def weights(self, task_stats: Sequence[TaskStats]) -> dict[str, float]:
        stats = tuple(task_stats)
        value = _call("curriculum.py", "weights", self._weights, stats)
        return validate_weights(value, [s.task_id for s in stats])

    def render_prompt(self, question: str, **extra: Any) -> str:
        try:
            return self._template.render(question=question, **extra)
        except (Exception, SystemExit) as exc:
            raise HarnessError(f"rollout.py: rendering PROMPT raised {type(exc).__name__}: {exc}") from None

    def render_prompts(self, questions: Sequence[str], **extra: Any) -> list[str]:
        return [self.render_prompt(q, **extra) for q in questions]

    def stop(self, turns: Sequence[Turn]) -> str | None:
        return validate_stop(_call("rollout.py", "stop", self._stop, tuple(turns)))

    def probe_values(self, rollouts: Sequence[Rollout], rewards: Sequence[float]) -> dict[str, float | None]:
        """Every probe's value on one batch, by probe name."""
        return {p.name: p.evaluate(rollouts, rewards) for p in self.probes}


def read_sources(folder: Path | str) -> dict[str, str]:
    """The harness files' texts from a folder (HarnessError for a missing folder or file)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise HarnessError(f"{folder}: harness folder not found")
    sources = {}
    for filename in HARNESS_FILES:
        file = folder / filename
        needs = "GRPO knobs and reward weights" if filename == SPEC_FILE else _needs(filename)
        if not file.is_file():
            raise HarnessError(f"{filename}: file not found in {folder} ({needs})")
        try:
            sources[filename] = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HarnessError(f"{filename}: cannot read ({needs}): {exc}") from None
    return sources


def load_harness(folder: Path | str) -> Harness:
    """Load and validate the harness in `folder`."""
    return Harness(read_sources(folder), Path(folder))
