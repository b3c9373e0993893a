"""The verifiers domain: the dataset of a `verifiers` environment module as tasks, its rubric as the check.

An environment written for the `verifiers` package (a module exposing `load_environment(**args)`
that returns e.g. `vf.SingleTurnEnv(dataset=..., rubric=vf.Rubric(funcs=[...], parser=...))`)
is loaded in-process. Its formatted dataset rows become tasks; its rubric's reward functions
score a completion. The environment is the author's code and is trusted like this domain: it
runs in the trainer's process, not in the sandbox. The rubric sees the task's own row (prompt,
answer, info) and the completion as one assistant message, nothing from the harness.

Only the classic (v0) API is supported, which verifiers 0.3.x still ships (as
`verifiers.legacy`, aliased at `verifiers.*`); 0.4 removed it. Single-turn environments only:
the trainer samples one completion, it does not run an environment's multi-turn loop.

We call the reward functions ourselves, the way `Rubric.score_rollout` does (same keyword
objects from `Rubric.score_objects`, same signature filtering), because verifiers logs a reward
function's exception and scores it 0.0: here it is the outcome kind `error`. Success means every
positively weighted function returned at least 1.0 and every negatively weighted one at most
0.0, i.e. the weighted reward reached the rubric's maximum under the usual [0, 1] convention.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import hashlib
import importlib.util
import json
import math
import random
import re
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from evotrainer.api import Outcome
from evotrainer.domains.base import Task, check_split

DOMAIN = "verifiers"
SUPPORTED = ((0, 3), (0, 4))  # [low, high): the versions whose classic API this module was built against
INSTALL_HINT = "pip install 'verifiers>=0.3.1,<0.4' (the verifiers extra of evotrainer)"
TIMEOUT_S = 60.0
EPS = 1e-9
_ID_OK = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


# ---------------------------------------------------------------- loading the environment


def _verifiers() -> Any:
    """The verifiers package, refused unless its version is one whose classic API we use."""
    try:
        import verifiers
    except ImportError:
        raise ValueError(f"the verifiers domain needs the verifiers package: {INSTALL_HINT}") from None
    version = str(getattr(verifiers, "__version__", "0"))
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2]) or (0,)
    low, high = SUPPORTED
    if not low <= parts < high:
        raise ValueError(f"verifiers {version} is installed; this domain uses the classic API of "
                         f"verifiers 0.3.x, which 0.4 removed: {INSTALL_HINT}")
    return verifiers


def _load_module_file(path: Path) -> Any:
    name = "_evotrainer_vf_env_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import environment file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_env(env: str, env_args: Mapping[str, Any]) -> Any:
    """The Environment that `env` names: an id or module name as `vf.load_environment` takes it
    ("vf-gsm8k" imports vf_gsm8k), or the path of a .py file that defines load_environment.

    Environment.__init__ installs SIGINT/SIGTERM handlers of its own (SIGTERM exits with 143 after
    its teardown); the trainer's handlers are put back, so only its atexit teardown remains.
    """
    vf = _verifiers()
    saved = ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
             if threading.current_thread() is threading.main_thread() else {})
    try:
        if env.endswith(".py"):
            path = Path(env)
            if not path.is_file():
                raise ValueError(f"verifiers env file {env!r} does not exist")
            loader = getattr(_load_module_file(path), "load_environment", None)
            if not callable(loader):
                raise ValueError(f"{env} does not define load_environment()")
            environment = loader(**env_args)
        else:
            environment = vf.load_environment(env, **env_args)
    except (ValueError, TypeError):
        raise
    except Exception as exc:  # the environment's own failure, one line for the config's user
        raise ValueError(f"verifiers env {env!r}: {type(exc).__name__}: {exc}") from None
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
    if not isinstance(environment, vf.Environment):
        raise ValueError(f"verifiers env {env!r}: load_environment returned {type(environment).__name__}, "
                         "not a verifiers Environment")
    if not (isinstance(environment, vf.SingleTurnEnv) or getattr(environment, "max_turns", None) == 1):
        raise ValueError(f"verifiers env {env!r} is a {type(environment).__name__} with more than one "
                         "turn; this domain scores one completion, so it takes single-turn environments only")
    return environment


# ---------------------------------------------------------------- the rubric's reward functions


def reward_functions(rubric: Any, vf: Any) -> list[tuple[Any, Callable[..., Any], float]]:
    """(the rubric that owns it, function, weight) for every weighted function, RubricGroups flattened.

    Each function is called with its own rubric's objects (its parser, a judge client, ...).
    Weight-0 functions are metrics: they cannot change the reward and are not run. A rubric that
    scores in its own way (an overridden score_rollout) or a group reward function (it needs a
    group of rollouts, and we score one) is refused rather than scored differently.
    """
    if isinstance(rubric, vf.RubricGroup):
        return [f for sub in rubric.rubrics for f in reward_functions(sub, vf)]
    name = type(rubric).__name__
    for method in ("score_rollout", "_call_individual_reward_func"):
        if getattr(type(rubric), method) is not getattr(vf.Rubric, method):
            raise ValueError(f"rubric {name} overrides {method}; this domain calls the reward functions "
                             "itself and would not score it the way its author does")
    out = []
    for func, weight in zip(rubric.funcs, rubric.weights):
        if rubric._is_group_func(func):
            raise ValueError(f"rubric {name}: {getattr(func, '__name__', func)!r} is a group reward "
                             "function; a single completion cannot be scored by it")
        if float(weight) != 0.0:
            out.append((rubric, func, float(weight)))
    return out


def _state(vf: Any, row: Mapping[str, Any], completion: str, truncated: bool) -> Any:
    """A rollout state as verifiers' init_state and a one-turn rollout leave it, minus the client."""
    from verifiers.types import flatten_task_input
    from verifiers.utils.message_utils import normalize_messages

    state_input = copy.deepcopy(dict(row))
    if isinstance(state_input.get("info"), str):
        state_input["info"] = json.loads(state_input["info"])
    try:
        state_input = flatten_task_input(state_input)
    except (ValueError, TypeError):  # a plain-string `task` column, as older environments have
        pass
    state = vf.State(input=state_input)
    state["task"] = state_input
    prompt = normalize_messages(state_input.get("prompt") or [], field_name="input.prompt")
    answer = normalize_messages([{"role": "assistant", "content": completion}], field_name="completion")
    state["prompt"] = prompt
    state["completion"] = answer
    state["trajectory"] = [{"prompt": prompt, "completion": answer, "response": None, "tokens": None,
                            "reward": None, "advantage": None, "is_truncated": truncated,
                            "trajectory_id": "", "extras": {}}]
    state.update(is_completed=True, is_truncated=truncated, stop_condition="max_turns_reached",
                 reward=None, metrics=None, error=None, tool_defs=[])
    return state


async def score(vf: Any, funcs: Sequence[tuple[Any, Callable[..., Any], float]], state: Any
                ) -> list[tuple[str, float, float]]:
    """(name, value, weight) per function, in order; the first exception propagates."""
    from verifiers.utils.async_utils import maybe_call_with_named_args

    out = []
    for rubric, func, weight in funcs:
        value = float(await maybe_call_with_named_args(func, **rubric.score_objects(state)))
        out.append((getattr(func, "__name__", repr(func)), value, weight))
    return out


class _Loop:
    """One event loop on a daemon thread for every check: the caller may be inside a loop of its
    own, and a rubric's async clients stay on the loop they were first used on. A check that runs
    past its time gets a fresh loop, since a stuck synchronous reward function blocks its thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="verifiers-domain", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        loop = self._get()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # the reward function's own TimeoutError, not ours
                raise
            future.cancel()
            with self._lock:
                if self._loop is loop:
                    self._loop = None
                    loop.call_soon_threadsafe(loop.stop)
            raise


# ---------------------------------------------------------------- rows to tasks


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _text(content: Any) -> str | None:
    """A message's text; None when it has a part that is not text (an image, audio)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            else:
                return None
        return "\n".join(parts)
    return None


def render_prompt(prompt: Any, keep_system: bool) -> str | None:
    """The task text of a row's prompt: the system prompt (it often says the answer format the
    parser wants) and then the user's message; a longer chat (few-shot turns) as labelled turns.
    None when the prompt has non-text content."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):
        return None
    system: list[tuple[str, str]] = []
    turns: list[tuple[str, str]] = []
    for message in prompt:
        if not isinstance(message, Mapping):
            return None
        text = _text(message.get("content"))
        if text is None:
            return None
        role = str(message.get("role", "user"))
        (system if role == "system" else turns).append((role, text))
    if len(turns) == 1 and turns[0][0] == "user":
        body = turns[0][1]
    else:
        body = "\n\n".join(f"{role.capitalize()}: {text}" for role, text in turns)
    head = [text for _, text in system] if keep_system else []
    return "\n\n".join(t for t in [*head, body] if t.strip())


def _answer_text(answer: Any) -> str:
    if answer is None:
        return ""
    if isinstance(answer, str):
        return answer
    return json.dumps(answer, sort_keys=True, default=str)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _row_id(row: Mapping[str, Any]) -> str | None:
    value = row.get("id")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        return None
    return str(value)


def _slug(env: str) -> str:
    name = Path(env).stem if env.endswith(".py") else env.split("/")[-1]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "env"


# ---------------------------------------------------------------- the domain


class VerifiersDomain:
    """A `verifiers` environment's dataset as tasks, its rubric as the check.

    `env` is what `vf.load_environment` takes (an installed environment's id or module name) or
    a .py file; `env_args` go to its load_environment. Held out: the environment's eval_dataset
    when it has one and `heldout_fraction` is not set (a train row whose prompt is also an eval
    row's is dropped); else a hash of each task's key puts `heldout_fraction` (default 0.2) of the
    rows aside. `system_prompt` keeps the system message at the head of the task text.
    """

    name = DOMAIN

    def __init__(self, env: str, env_args: Mapping[str, Any] | None = None,
                 heldout_fraction: float | None = None, system_prompt: bool = True,
                 timeout_s: float = TIMEOUT_S) -> None:
        if not isinstance(env, str) or not env.strip():
            raise ValueError("the verifiers domain needs domain.options.env (an environment id, "
                             "module name or .py file)")
        if heldout_fraction is not None and not 0.0 < float(heldout_fraction) < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if env_args is not None and not isinstance(env_args, Mapping):
            raise ValueError(f"env_args must be a mapping, got {type(env_args).__name__}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.env_id = env
        self.env_args = dict(env_args or {})
        self.timeout_s = float(timeout_s)
        self._vf = _verifiers()
        self.environment = load_env(env, self.env_args)
        self._funcs = reward_functions(self.environment.rubric, self._vf)
        if not any(w > 0 for _, _, w in self._funcs):
            raise ValueError(f"verifiers env {env!r}: its rubric has no positively weighted reward "
                             "function, so no completion can succeed")
        self._loop = _Loop()
        self._rows: dict[str, dict[str, Any]] = {}
        self.skipped: dict[str, int] = {}  # why rows were left out, and how many
        self._prefix = f"vf-{_slug(env)}"
        self._keep_system = bool(system_prompt)
        try:
            self._pools = self._build(heldout_fraction)
        except ValueError:
            raise
        except Exception as exc:  # a dataset builder's own failure (a download, a missing file)
            raise ValueError(f"verifiers env {env!r}: building its dataset raised "
                             f"{type(exc).__name__}: {exc}") from None

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def _rows_of(self, which: str) -> list[tuple[int, dict[str, Any]]]:
        build = self.environment.build_dataset if which == "dataset" else self.environment.build_eval_dataset
        dataset = build()
        return [] if dataset is None else list(enumerate(dataset))

    def _task(self, which: str, index: int, row: dict[str, Any], split: str | None,
              fraction: float) -> Task | None:
        text = render_prompt(row.get("prompt"), self._keep_system)
        if text is None:
            self._skip("non-text prompt")
            return None
        if not text.strip():
            self._skip("empty prompt")
            return None
        row_id = _row_id(row)
        key = f"id:{row_id}" if row_id is not None else "prompt:" + _digest(text)
        if split == "heldout" and row_id is not None:
            key = "eval-" + key  # an eval dataset numbers its rows on its own
        if row_id is not None and _ID_OK.match(row_id):
            tail = row_id if not key.startswith("eval-") else f"eval-{row_id}"
        else:
            tail = _digest(key)[:10]
        if split is None:
            bucket = int(_digest(key)[8:16], 16) / 2**32
            split = "heldout" if bucket < fraction else "train"
        info = row.get("info")
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except json.JSONDecodeError:
                pass
        meta = {"key": key, "env": self.env_id, "source": which, "row": index, "info": info,
                "task": row.get("task"), "messages": row.get("prompt")}
        return Task(task_id=f"{self._prefix}-{tail}", domain=DOMAIN, split=split, level=0, prompt=text,
                    answer=_answer_text(row.get("answer")), meta=_jsonable(meta))

    def _build(self, heldout_fraction: float | None) -> dict[str, list[Task]]:
        train_rows = self._rows_of("dataset")
        eval_rows = self._rows_of("eval_dataset")
        use_eval = heldout_fraction is None and bool(eval_rows) and bool(train_rows)
        fraction = 0.2 if heldout_fraction is None else float(heldout_fraction)
        sources = ([("eval_dataset", eval_rows, "heldout"), ("dataset", train_rows, "train")] if use_eval
                   else [("dataset" if train_rows else "eval_dataset", train_rows or eval_rows, None)])
        pools: dict[str, list[Task]] = {"train": [], "heldout": []}
        seen_ids: set[str] = set()
        seen_prompts: dict[str, str] = {}  # task text -> the split that holds it
        for which, rows, split in sources:
            for index, row in rows:
                task = self._task(which, index, row, split, fraction)
                if task is None:
                    continue
                if task.task_id in seen_ids or task.prompt in seen_prompts:
                    held = seen_prompts.get(task.prompt)
                    self._skip("train row repeats an eval row" if use_eval and held == "heldout"
                               else "duplicate row")
                    continue
                seen_ids.add(task.task_id)
                seen_prompts[task.prompt] = task.split
                self._rows[task.task_id] = row
                pools[task.split].append(task)
        if use_eval and not pools["train"]:
            raise ValueError(f"verifiers env {self.env_id!r}: every train row is also in its eval_dataset; "
                             "set domain.options.heldout_fraction to split the dataset instead")
        return pools

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        pool = list(self._pools[split])
        random.Random(f"{DOMAIN}:{self.env_id}:{split}:{seed}").shuffle(pool)
        return pool[:n]

    def all_tasks(self) -> list[Task]:
        return [*self._pools["train"], *self._pools["heldout"]]

    def rewards(self, task: Task, completion: str, truncated: bool = False) -> list[tuple[str, float, float]]:
        """(function name, value, weight) of each weighted reward function; raises what they raise."""
        row = self._rows[task.task_id]
        state = _state(self._vf, row, completion, truncated)
        return self._loop.run(score(self._vf, self._funcs, state), self.timeout_s)

    def check(self, task: Task, completion: str, truncated: bool) -> Outcome:
        try:
            if not isinstance(completion, str) or not completion.strip():
                return Outcome(False, 0.0, "empty")
            if task.task_id not in self._rows:
                return Outcome(False, 0.0, "error", ("unknown_task",))
            try:
                parts = self.rewards(task, completion, truncated)
            except (TimeoutError, concurrent.futures.TimeoutError):  # distinct types before 3.11
                return Outcome(False, 0.0, "timeout", ("rubric_timeout",))
            except Exception:
                return Outcome(False, 0.0, "error", ("rubric_error",))
            if not all(math.isfinite(v) for _, v, _ in parts):
                return Outcome(False, 0.0, "error", ("bad_reward",))
            reward = sum(v * w for _, v, w in parts)
            success = all(v >= 1.0 - EPS if w > 0 else v <= EPS for _, v, w in parts)
            if success:
                return Outcome(True, reward, "ok")
            return Outcome(False, reward, "truncated" if truncated else "wrong")
        except Exception:
            return Outcome(False, 0.0, "error", ("checker_error",))
