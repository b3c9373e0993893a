"""The reasoning_gym domain: tasks from reasoning-gym's seeded generators, graded by their own scorers.

Tasks. Each chosen generator yields an endless stream of entries from datasets whose seeds are
hashes of (generator, config, split, seed, chunk). A hash of the generator's name and the question
text alone fixes the task id and the split, so the same question is always the same task and a
held-out question can never be drawn for train, whatever the seeds (as in the math domain).

Answers. The model's answer is the text of the first `<answer>...</answer>` block or, when there is
none, of the first `Answer: ...` line (see `extract_answer`). Success is the generator's `score_answer`
returning exactly 1.0; a partial score is kept in `Outcome.score`.

Vetting. reasoning-gym's scorers are not all fit to be a trusted check: some accept any non-empty
answer, some run the model's text through `eval` or sympy's `parse_expr` (which evals), some
generators are not seed-deterministic. `vet` measures each chosen generator at construction and
the domain refuses any that fails; bench/rgym_survey.py runs it over the whole package. While a
scorer runs, an audit hook (`_guard`) blocks compiling source text and starting processes, so a
scorer that would eval a completion cannot, whether or not vetting saw it do so.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split
from evotrainer.paths import HARNESSES_DIR

DOMAIN = "reasoning_gym"
SEED_HARNESS = HARNESSES_DIR / "reasoning_gym"
INSTALL_HINT = "pip install reasoning-gym==0.1.25 (the evotrainer[rgym] extra)"
CHUNK = 64  # entries per generated dataset; its size is part of what regenerates an entry
_CACHE_MAX = 50_000

# Measured by bench/rgym_survey.py (two processes, PYTHONHASHSEED 1 and 2, same seeds): these
# generators' questions or answers differ between processes, so a task id would not name the
# same problem in the next run. In-process vetting cannot see this, so they are listed here.
_UNSTABLE = "not seed-deterministic across processes: entries differ under PYTHONHASHSEED 1 and 2"
CROSS_PROCESS_UNSTABLE: dict[str, str] = {name: _UNSTABLE for name in (
    "isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder")}


class RgError(ValueError):
    """A generator spec that cannot be used; the message names the generator and why."""


# ---------------------------------------------------------------- generator specs


@dataclass(frozen=True)
class GeneratorSpec:
    """One chosen generator: its reasoning-gym name, config overrides, sampling weight and level."""

    name: str
    config: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    level: int = 0

    @property
    def key(self) -> str:
        return self.name + ":" + json.dumps(dict(self.config), sort_keys=True, default=repr)


def parse_generators(value: Any) -> list[GeneratorSpec]:
    """Specs from `domain.options.generators`: "a,b", a list of names and/or
    {name, config, weight, level} mappings, or a mapping name -> config (or -> such a mapping)."""
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, Mapping):
        items = [{"name": k, **(v if isinstance(v, Mapping) and ({"config", "weight", "level"} & set(v))
                                else {"config": v or {}})} for k, v in value.items()]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise RgError(f"generators must be a list of generator names, got {type(value).__name__}")
    if not items:
        raise RgError("generators is empty: name at least one reasoning-gym generator")
    specs = []
    for item in items:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise RgError(f"generator entry {item!r} is neither a name nor a mapping with a 'name'")
        unknown = set(item) - {"name", "config", "weight", "level"}
        if unknown:
            raise RgError(f"generator {item['name']!r}: unknown keys {sorted(unknown)} "
                          "(known: name, config, weight, level)")
        config = dict(item.get("config") or {})
        if {"seed", "size"} & set(config):
            raise RgError(f"generator {item['name']!r}: config may not set seed or size (the domain sets them)")
        weight, level = item.get("weight", 1.0), item.get("level", 0)
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0:
            raise RgError(f"generator {item['name']!r}: weight must be a positive number, got {weight!r}")
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise RgError(f"generator {item['name']!r}: level must be an int >= 0, got {level!r}")
        specs.append(GeneratorSpec(item["name"], config, float(weight), level))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise RgError(f"generators names one generator twice: {names}")
    return specs


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise RgError(f"the reasoning_gym domain needs the reasoning-gym package ({exc}); {INSTALL_HINT}") from None
    return reasoning_gym


def make_dataset(spec: GeneratorSpec, seed: int, size: int) -> Any:
    """reasoning-gym's dataset for a spec; RgError names what is wrong with the name or config."""
    rg = _rg()
    from reasoning_gym.factory import DATASETS

    if spec.name not in DATASETS:
        raise RgError(f"unknown reasoning-gym generator {spec.name!r}; known: {', '.join(sorted(DATASETS))}")
    try:
        return rg.create_dataset(spec.name, **dict(spec.config), seed=seed, size=size)
    except Exception as exc:  # a bad config key or value: the library's own message, on one line
        raise RgError(f"generator {spec.name!r}: config {dict(spec.config)} rejected: "
                      f"{type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------- the scoring guard

_state = threading.local()
_hook_lock = threading.Lock()
_hook_installed = False
# Events a scorer has no business raising: each would run model text or another program.
_BLOCKED = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                      "os.forkpty", "pty.spawn", "pickle.find_class", "ctypes.dlopen", "socket.connect"})


class ScorerRanCode(RuntimeError):
    """Raised inside a scorer that compiled source text or started a process while scoring."""


def _audit(event: str, args: tuple) -> None:
    if not getattr(_state, "active", False):
        return
    if event == "compile":
        # A module imported from its source file is fine; `eval`, `exec` and sympy's parse_expr of
        # a string compile it under "<string>" and the like, and that string may be the answer.
        source, filename = (args + (None, None))[:2]
        if isinstance(filename, str) and filename.endswith(".py"):
            return
        if isinstance(source, bytes):
            source = source.decode("utf-8", "replace")
        if isinstance(source, str) and source.strip() in _state.trusted:
            return  # the generator's own gold text (number_sorting evals it): nothing of the model's
    elif event not in _BLOCKED:
        return
    _state.events.append(event)
    raise ScorerRanCode(f"{event} while scoring")


@contextmanager
def _guard(trusted: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """While active in this thread, compiling source text (other than `trusted` texts) or starting
    processes raises ScorerRanCode; the yielded list collects the events, since a scorer may
    swallow the exception."""
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:  # once per process: audit hooks cannot be removed
            sys.addaudithook(_audit)
            _hook_installed = True
    events: list[str] = []
    _state.events, _state.trusted, _state.active = events, trusted, True
    try:
        yield events
    finally:
        _state.active = False


def score(dataset: Any, answer: str, entry: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """(the scorer's score, None) or (None, why it could not be trusted). Never raises."""
    gold = entry.get("answer")
    try:
        with _guard(frozenset({gold.strip()}) if isinstance(gold, str) else frozenset()) as events:
            raw = dataset.score_answer(answer, entry)
    except ScorerRanCode:
        return None, "scorer_ran_code"
    except Exception:
        return None, "scorer_raised"
    if events:
        return None, "scorer_ran_code"
    try:  # numpy floats and the like
        value = float(raw)
    except (TypeError, ValueError):
        return None, "scorer_out_of_range"
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, "scorer_out_of_range"
    return value, None


# ---------------------------------------------------------------- vetting


@dataclass
class Vetting:
    """What vetting measured for one generator; `problems` empty means it is fit to use."""

    name: str
    problems: list[str] = field(default_factory=list)
    checked: int = 0
    partial_wrong: int = 0  # wrong probes that got a partial score (0 < s < 1): shaping, not success
    notes: set[str] = field(default_factory=set)  # leniencies measured but not refused

    @property
    def ok(self) -> bool:
        return not self.problems


def _entry_digest(entry: Mapping[str, Any]) -> str:
    return _digest(json.dumps([entry.get("question"), entry.get("answer")], default=repr))


def vet(spec: GeneratorSpec, samples: int = 8, seed: int = 1234) -> Vetting:
    """Measure a generator: (a) one seed gives the same entries twice; (b) each gold answer scores
    1.0; (c) wrong answers do not: "", "x", the question echoed, another entry's answer, and lists
    of candidates with the gold answer last; (d) the scorer never compiles text or starts a process."""
    out = Vetting(spec.name)
    if spec.name in CROSS_PROCESS_UNSTABLE:
        out.problems.append(CROSS_PROCESS_UNSTABLE[spec.name])
        return out
    try:
        first, second = make_dataset(spec, seed, samples), make_dataset(spec, seed, samples)
        entries = [first[i] for i in range(samples)]
        again = [second[i] for i in range(samples)]
    except RgError:
        raise
    except Exception as exc:
        out.problems.append(f"generating raised {type(exc).__name__}: {str(exc)[:120]}")
        return out
    if [_entry_digest(e) for e in entries] != [_entry_digest(e) for e in again]:
        out.problems.append("not seed-deterministic: the same seed gave different entries")
    if any(e.get("answer") is None for e in entries):
        out.problems.append("no gold answer (answer is None: the scorer verifies free-form solutions, "
                            "which vetting cannot test against a known answer)")
    elif not all(isinstance(e.get("question"), str) and isinstance(e.get("answer"), str) for e in entries):
        out.problems.append("an entry's question or answer is not a string")
    if out.problems:
        return out
    failures: dict[str, int] = {}
    for i, entry in enumerate(entries):
        gold, question = entry["answer"], entry["question"]
        others = [e["answer"] for e in entries if e["answer"].strip() != gold.strip()]
        other = others[i % len(others)] if others else None
        got, why = score(first, gold, entry)
        found: set[str] = set()
        if got != 1.0:
            found.add(f"gold answer scores {why or got}")
        probes = {"empty answer": "", "garbage 'x'": "x", "question echoed": question}
        if other is not None:
            probes["another entry's answer"] = other
            probes["candidates 'other\\ngold'"] = f"{other}\n{gold}"
            probes["candidates 'other, gold'"] = f"{other}, {gold}"
            probes["candidates 'other gold'"] = f"{other} {gold}"
        for label, wrong in probes.items():
            got, why = score(first, wrong, entry)
            what = ("scorer compiles text or starts a process on a wrong answer (eval-like)"
                    if why == "scorer_ran_code" else f"accepts the {label}" if got == 1.0 else None)
            if what is not None:
                found.add(what)
            elif got is not None and got > 0.0:
                out.partial_wrong += 1
        if other is not None and score(first, f"{gold}, {other}", entry)[0] == 1.0:
            # Ignoring what follows the gold is no opening: the gold must come first, so a list of
            # guesses is graded on its first guess alone. Noted, not refused.
            out.notes.add("scores 'gold, other' 1.0 (ignores what follows the gold)")
        for what in found:
            failures[what] = failures.get(what, 0) + 1
        out.checked += 1
    out.problems += [f"{what} ({n} of {samples})" for what, n in sorted(failures.items())]
    return out


_vetted: dict[str, Vetting] = {}


def vetted(spec: GeneratorSpec, samples: int) -> Vetting:
    """`vet`, once per process for each spec and sample count."""
    key = f"{spec.key}:{samples}"
    if key not in _vetted:
        _vetted[key] = vet(spec, samples)
    return _vetted[key]


# ---------------------------------------------------------------- answer extraction

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_LINE = re.compile(r"^[ \t]*(?:final[ \t]+)?answer[ \t]*:[ \t]*(.*?)[ \t]*$", re.IGNORECASE | re.MULTILINE)


# Without a marker: what the last line says is the answer ("The final answer ... is 89.") or the
# right-hand side of an equation on it ("74 + 88 = 152").
_SAYS = re.compile(r"^.*?\b(?:answer|result)\b[^:\n]*?(?:\bis\b[:\s]*|:\s*)", re.IGNORECASE)


def _last_line_answer(completion: str) -> str:
    last = [line.strip() for line in completion.splitlines() if line.strip()][-1]
    if len(last) > 4000:  # past any answer's length (max_answer_chars refuses it); no regex on it
        return last
    last = _SAYS.sub("", last, count=1)
    if "=" in last:
        last = last.rsplit("=", 1)[1]
    return last.strip().rstrip(".").strip()


def extract_answer(completion: str, truncated: bool = False) -> tuple[str | None, str]:
    """(the answer, "") or (None, why there is none); the reason is also a flag word.

    The answer is the first `<answer>...</answer>` block or, when there is none, the rest of the
    first line that starts with "Answer:" (or "Final answer:"). The first wins and everything after
    it is ignored: a base model that answers and then invents more question/answer pairs is graded
    on its own answer, and listing candidates gains nothing since only one is ever read. In a
    truncated completion an "Answer:" on the last, unfinished line may be cut short, so it does not
    count ("truncated"); a closed block does.

    With no marker at all, the last line is the one candidate: what it says the answer is, or the
    right-hand side of its last "=" (flag `no_answer_marker`). SmolLM2-135M writes "The final
    answer to the given arithmetic problem is 89." and "74 + 88 = 152" far more often than
    "Answer: 89" (128 of 128 chain_sum held-out replies had no marker), and one candidate per
    completion leaves nothing to game. A cut-off completion without a marker is "truncated".
    """
    tag = _TAG.search(completion)
    if tag is not None:
        found = tag.group(1).strip()
    else:
        line = _LINE.search(completion)
        if line is None:
            if truncated:
                return None, "truncated"
            bare = _last_line_answer(completion)
            return (bare, "no_answer_marker") if bare else (None, "no_answer_marker")
        if truncated and "\n" not in completion[line.end():]:
            return None, "truncated"
        found = line.group(1).strip()
    return (found, "") if found else (None, "empty_answer")


def answer_count(completion: str) -> int:
    """How many answers a completion gives, of the kind extract_answer read (for a flag)."""
    return len(_TAG.findall(completion)) or len(_LINE.findall(completion))


# ---------------------------------------------------------------- the domain


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_of(generator: str, question: str, heldout_fraction: float) -> str:
    bucket = int(_digest(f"{generator}\n{question}")[8:16], 16) / 2**32
    return "heldout" if bucket < heldout_fraction else "train"


def task_id_of(generator: str, question: str) -> str:
    return f"rg-{generator}-{_digest(generator + chr(10) + question)[:10]}"


class ReasoningGymDomain:
    """Tasks from reasoning-gym generators, each graded by the generator's own scorer.

    `generators` (required) names them, with optional per-generator config, weight and level
    (`parse_generators`). Each is vetted at construction (`vet`, `vet_samples` entries); a
    generator that fails is refused with what was measured. `tasks` returns exactly n distinct
    tasks (ValueError when the generators run out of distinct questions of that split).
    """

    name = DOMAIN

    def __init__(self, generators: Any = None, heldout_fraction: float = 0.2, vet_samples: int = 8,
                 max_answer_chars: int = 2000) -> None:
        if generators is None:
            raise RgError("domain.options.generators is required: a list of reasoning-gym generator "
                          "names, e.g. [basic_arithmetic, chain_sum, leg_counting]")
        if not 0.0 < heldout_fraction < 1.0:
            raise RgError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if not isinstance(vet_samples, int) or vet_samples < 2:
            raise RgError(f"vet_samples must be an int >= 2, got {vet_samples!r}")
        if not isinstance(max_answer_chars, int) or max_answer_chars < 1:
            raise RgError(f"max_answer_chars must be a positive int, got {max_answer_chars!r}")
        self.specs = parse_generators(generators)
        refused = [v for v in (vetted(s, vet_samples) for s in self.specs) if not v.ok]
        if refused:
            raise RgError("refused reasoning-gym generators (their scorer is not a trustworthy check): "
                          + "; ".join(f"{v.name}: {', '.join(v.problems)}" for v in refused))
        self.heldout_fraction = float(heldout_fraction)
        self.max_answer_chars = max_answer_chars
        self._by_name = {s.name: s for s in self.specs}
        self._datasets: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._entries: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ tasks

    def _dataset(self, spec: GeneratorSpec, seed: int, size: int) -> Any:
        key = (spec.name, seed, size)
        with self._lock:
            ds = self._datasets.get(key)
            if ds is None:
                ds = self._datasets[key] = make_dataset(spec, seed, size)
                while len(self._datasets) > 256:
                    self._datasets.popitem(last=False)
            return ds

    def _remember(self, task_id: str, entry: Mapping[str, Any]) -> None:
        with self._lock:
            self._entries[task_id] = entry
            while len(self._entries) > _CACHE_MAX:
                self._entries.popitem(last=False)

    def _stream(self, spec: GeneratorSpec, split: str, seed: int) -> Iterator[tuple[int, int, Mapping[str, Any]]]:
        chunk = 0
        while True:
            ds_seed = int(_digest(f"rg:{spec.key}:{split}:{seed}:{chunk}")[:8], 16)
            ds = self._dataset(spec, ds_seed, CHUNK)
            for index in range(CHUNK):
                yield ds_seed, index, ds[index]
            chunk += 1

    def _task(self, spec: GeneratorSpec, ds_seed: int, index: int, entry: Mapping[str, Any]) -> Task:
        question = entry["question"]
        return Task(
            task_id=task_id_of(spec.name, question),
            domain=DOMAIN,
            split=split_of(spec.name, question, self.heldout_fraction),
            level=spec.level,
            prompt=question,
            answer=str(entry["answer"]),
            meta={"source": "reasoning_gym", "generator": spec.name, "config": dict(spec.config),
                  "dataset_seed": ds_seed, "dataset_size": CHUNK, "index": index},
        )

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"rg:{split}:{seed}:{[s.key for s in self.specs]}")
        streams = {s.name: self._stream(s, split, seed) for s in self.specs}
        weights = [s.weight for s in self.specs]
        out: list[Task] = []
        seen: set[str] = set()
        budget = 1000 + 200 * n
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(f"reasoning_gym generators {[s.name for s in self.specs]} ran out of "
                                 f"distinct {split} questions after {len(out)} of {n}")
            spec = rng.choices(self.specs, weights)[0]
            ds_seed, index, entry = next(streams[spec.name])
            task = self._task(spec, ds_seed, index, entry)
            if task.split != split or task.task_id in seen:
                continue
            seen.add(task.task_id)
            self._remember(task.task_id, entry)
            out.append(task)
        return out

    def _entry(self, task: Task) -> Mapping[str, Any]:
        """The generator's entry behind a task: remembered, or regenerated from its meta."""
        entry = self._entries.get(task.task_id)
        if entry is None:
            meta = task.meta
            spec = self._by_name.get(str(meta.get("generator")))
            if spec is None:
                raise RgError(f"task {task.task_id} is from generator {meta.get('generator')!r}, "
                              "which this domain was not built with")
            entry = self._dataset(spec, int(meta["dataset_seed"]), int(meta["dataset_size"]))[int(meta["index"])]
            self._remember(task.task_id, entry)
        if entry["question"] != task.prompt or str(entry["answer"]) != task.answer:
            raise RgError(f"task {task.task_id}: the regenerated entry is not the task's question")
        return entry

    # ------------------------------------------------------------ the trusted check

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        try:
            if not isinstance(completion, str) or not completion.strip():
                return Outcome(False, 0.0, "empty")
            answer, why = extract_answer(completion, truncated)
            marker_flags = (why,) if answer is not None and why else ()
            if answer is None:
                kind = "truncated" if why == "truncated" else "format_error"
                return Outcome(False, 0.0, kind, (why,) if kind == "format_error" else ())
            if len(answer) > self.max_answer_chars:
                return Outcome(False, 0.0, "format_error", ("answer_too_long",))
            entry = self._entry(task)
            spec = self._by_name[str(task.meta["generator"])]
            ds = self._dataset(spec, int(task.meta["dataset_seed"]), int(task.meta["dataset_size"]))
            got, problem = score(ds, answer, entry)
            if got is None:
                return Outcome(False, 0.0, "error", (str(problem),))
            flags = marker_flags + (("more_answers_ignored",) if answer_count(completion) > 1 else ())
            if got == 1.0:
                return Outcome(True, 1.0, "ok", flags)
            return Outcome(False, got, "wrong", flags + (("partial",) if got > 0 else ()))
        except Exception:
            return Outcome(False, 0.0, "error", ("checker_error",))


def make(generators: Any = None, heldout_fraction: float = 0.2, vet_samples: int = 8,
         max_answer_chars: int = 2000) -> ReasoningGymDomain:
    """reasoning-gym's procedural generators, each graded by its own vetted scorer."""
    return ReasoningGymDomain(generators, heldout_fraction, vet_samples, max_answer_chars)


make.seed_harness = SEED_HARNESS  # type: ignore[attr-defined]
