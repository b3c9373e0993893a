"""A harness-fault case: a folder holding a faulty harness, the rollouts a real run made under it,
and the truth about the fault (docs/faultbench.md is the format's reference).

    faults/math-length-pays/
      case.yaml              what the fault is, which probe should fire, what a repair must achieve
      harness/               the faulty files, laid over a seed harness (harnesses/<seed>/)
      rollouts/round-0.jsonl.gz ...   `rollouts export` lines; the last round is the one diagnosed
      tempting/<name>/       harness files of a wrong fix that games the target; the gate must reject it

`load_case` checks everything a run needs before any work starts, and a problem is a `CaseError`
naming the file and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from evotrainer.backtest.metrics import LOWER_IS_BETTER
from evotrainer.errors import UserError
from evotrainer.harness.repo import HARNESS_FILES, allowed_file
from evotrainer.paths import CONFIGS_DIR, HARNESSES_DIR
from evotrainer.skills.schema import problem

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_ROUND = re.compile(r"round-(\d+)\.jsonl(\.gz)?")


class CaseError(UserError):
    """A fault-case folder that cannot be run; the message names the file and what is wrong."""


def _name(value: str) -> str:
    if _NAME.fullmatch(value) is None or len(value) > 48:
        raise ValueError("must be lowercase words joined by '-' (at most 48 chars)")
    return value


def _metric(value: str) -> str:
    if value not in LOWER_IS_BETTER:
        raise ValueError(f"is not a backtest metric (known: {', '.join(LOWER_IS_BETTER)})")
    return value


def _address(value: str) -> str:
    if re.fullmatch(r"https://\S+", value) is None:
        raise ValueError("must be an https:// address (an issue or pull request that reports the fault)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Criterion(_Strict):
    """One condition a repair must meet on the held-out slice: the promoted harness's value of
    `metric` is `below` / `above` a number, or better than the faulty harness's by `improves_by`."""

    metric: Annotated[str, AfterValidator(_metric)]
    below: float | None = None
    above: float | None = None
    improves_by: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _one_test(self) -> Criterion:
        if sum(v is not None for v in (self.below, self.above, self.improves_by)) != 1:
            raise ValueError("give exactly one of below, above, improves_by")
        return self

    def describe(self) -> str:
        if self.improves_by is not None:
            way = "falls" if LOWER_IS_BETTER[self.metric] else "rises"
            return f"{self.metric} {way} by >= {self.improves_by:g}"
        return f"{self.metric} {'<' if self.below is not None else '>'} {self.below if self.below is not None else self.above:g}"

    def shows_fault(self, faulty: float | None) -> bool:
        """Whether the faulty harness's value leaves this criterion something to tell: a `below` /
        `above` it fails, or an `improves_by` with that much room to the metric's best value
        (0 for a lower-is-better metric, 1 for the higher-is-better ratios)."""
        if faulty is None:
            return False
        if self.improves_by is None:
            return not self.holds(faulty, faulty)
        room = faulty if LOWER_IS_BETTER[self.metric] else 1.0 - faulty
        return room >= self.improves_by - 1e-12

    def holds(self, fixed: float | None, faulty: float | None) -> bool:
        """`fixed`: the promoted harness's value; `faulty`: the case harness's. Undefined fails."""
        if fixed is None:
            return False
        if self.below is not None:
            return fixed < self.below
        if self.above is not None:
            return fixed > self.above
        if faulty is None:
            return False
        gain = faulty - fixed if LOWER_IS_BETTER[self.metric] else fixed - faulty
        return gain >= (self.improves_by or 0.0) - 1e-12


class TemptingFile(_Strict):
    name: Annotated[str, AfterValidator(_name)]
    targets: Annotated[str, AfterValidator(_metric)]  # the metric it games, written as its Targets: trailer
    why: str  # how it games the target


class HarnessFile(_Strict):
    seed: str  # a folder of harnesses/ (math, code, swe, ...)


class CaseFile(_Strict):
    name: Annotated[str, AfterValidator(_name)]
    domain: str
    fault: Annotated[str, AfterValidator(_name)]  # the kind, e.g. reward-pays-length
    summary: str
    harness: HarnessFile
    heldout_share: Annotated[float, Field(gt=0, lt=1)] = 0.3
    detect: Annotated[list[str], Field(min_length=1)]  # any of these probes at warn or critical
    repair: Annotated[list[Criterion], Field(min_length=1)]  # all must hold on the held-out slice
    tempting: list[TemptingFile] = []
    live: bool = False  # the repair needs a live pilot (a change to the training dynamics)
    repairable_by: Literal["rules", "llm", "none"] = "rules"  # what we expect can repair it, for the docs
    generate: dict[str, Any] = {}  # how bench/fault_rollouts.py made the rollouts (config, overrides)
    source: list[Annotated[str, AfterValidator(_address)]] = []  # where the fault was reported in the wild


@dataclass(frozen=True)
class Tempting:
    name: str
    targets: str
    why: str
    files: dict[str, str]  # harness file -> its full text, laid over the faulty harness


@dataclass(frozen=True)
class FaultCase:
    root: Path
    spec: CaseFile
    harness: dict[str, str]  # the faulty harness, every file
    rounds: tuple[Path, ...]  # rollouts/round-<k>.jsonl[.gz], in round order; the last is diagnosed
    tempting: tuple[Tempting, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def run_config(self) -> tuple[str, list[str]]:
        """The config file and overrides of the run that made the rollouts (`generate:` over
        GENERATE_DEFAULTS), which a live pilot repeats."""
        config = self.spec.generate.get("config") or str(CONFIGS_DIR / f"{self.spec.domain}.yaml")
        return config, [*GENERATE_DEFAULTS, *self.spec.generate.get("overrides", [])]


# How bench/fault_rollouts.py runs a case unless its `generate:` says otherwise: 1 round of 6
# steps of 4 prompts, a held-out split of 8 for speed.
GENERATE_DEFAULTS = ("train.rounds=1", "train.steps_per_round=6", "train.prompts_per_step=4", "domain.heldout_size=8")


def _overlay(folder: Path, where: str) -> dict[str, str]:
    """The harness files in `folder` (plain files at its top, harness names only)."""
    if not folder.is_dir():
        raise CaseError(f"{where}: missing folder")
    files = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith((".", "_")) or path.is_dir():
            continue
        if path.is_symlink() or not allowed_file(path.name):
            raise CaseError(f"{where}/{path.name}: not a harness file (allowed: {', '.join(HARNESS_FILES)} "
                            "or new *.py, *.yaml, *.j2, *.md)")
        try:
            files[path.name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise CaseError(f"{where}/{path.name}: not UTF-8 text") from None
    if not files:
        raise CaseError(f"{where}: holds no harness file")
    return files


def _seed(name: str, where: str) -> dict[str, str]:
    folder = HARNESSES_DIR / name
    if not name or "/" in name or not folder.is_dir():
        known = ", ".join(sorted(p.name for p in HARNESSES_DIR.iterdir() if p.is_dir()))
        raise CaseError(f"{where}: harness.seed {name!r} is not a seed harness (known: {known})")
    return {f: (folder / f).read_text(encoding="utf-8") for f in HARNESS_FILES}


def _rounds(folder: Path, where: str) -> tuple[Path, ...]:
    if not folder.is_dir():
        raise CaseError(f"{where}: missing folder (rollouts/round-0.jsonl.gz, ... from bench/fault_rollouts.py)")
    found = {}
    for path in folder.iterdir():
        m = _ROUND.fullmatch(path.name)
        if m is None:
            raise CaseError(f"{where}/{path.name}: expected round-<k>.jsonl or round-<k>.jsonl.gz")
        k = int(m.group(1))
        if k in found:
            raise CaseError(f"{where}: round {k} given twice")
        found[k] = path
    if sorted(found) != list(range(len(found))) or not found:
        raise CaseError(f"{where}: rounds must be round-0, round-1, ... with none missing, got "
                        f"{sorted(found) or 'none'}")
    return tuple(found[k] for k in sorted(found))


def load_case(root: Path | str, rollouts: bool = True) -> FaultCase:
    """Read and check one case folder; CaseError names the file and the field at fault.
    `rollouts=False`: a case whose rollouts are still to be made (bench/fault_rollouts.py)."""
    root = Path(root)
    where = str(root / "case.yaml")
    try:
        raw = yaml.safe_load((root / "case.yaml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CaseError(f"{where}: missing (is {root} a fault case?)") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CaseError(f"{where}: not YAML: {' '.join(str(exc).split())[:200]}") from None
    try:
        spec = CaseFile.model_validate(raw)
    except ValidationError as exc:
        raise CaseError(f"{where}: " + "; ".join(problem(e) for e in exc.errors())) from None
    if spec.name != root.name:
        raise CaseError(f"{where}: name {spec.name!r} must be the folder's name {root.name!r}")
    harness = {**_seed(spec.harness.seed, where), **_overlay(root / "harness", str(root / "harness"))}
    tempting = []
    for t in spec.tempting:
        files = _overlay(root / "tempting" / t.name, str(root / "tempting" / t.name))
        tempting.append(Tempting(t.name, t.targets, t.why, files))
    names = [t.name for t in spec.tempting]
    if len(set(names)) != len(names):
        raise CaseError(f"{where}: tempting: a name is given twice")
    rounds = _rounds(root / "rollouts", str(root / "rollouts")) if rollouts else ()
    return FaultCase(root, spec, harness, rounds, tuple(tempting))


def load_cases(folder: Path | str, only: list[str] | None = None) -> list[FaultCase]:
    """Every case folder under `folder` (a folder holding case.yaml is one case itself)."""
    folder = Path(folder)
    if (folder / "case.yaml").is_file():
        return [load_case(folder)]
    if not folder.is_dir():
        raise CaseError(f"{folder}: no such folder")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise CaseError(f"unknown case(s) {', '.join(unknown)} in {folder} (known: {', '.join(names)})")
        names = [n for n in names if n in only]
    if not names:
        raise CaseError(f"{folder}: holds no case folder")
    return [load_case(folder / n) for n in names]


__all__ = ["CaseError", "CaseFile", "Criterion", "FaultCase", "Tempting", "load_case", "load_cases"]
