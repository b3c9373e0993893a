"""The Toolbox: one round's tool surface over a workspace, the same for every outer agent.

    with Toolbox(workdir, run="tiny", round_index=2, max_calls=40, max_submissions=2) as tools:
        tools.specs()                                    # OpenAI-compatible `tools` list
        tools.call("list_rollouts", {"success": False, "limit": 5})
        # -> {"ok": True, "result": {...}}  or  {"ok": False, "error": {"kind": ..., "message": ...}}

Every call goes through `call`: the budget check, the argument check against the tool's schema,
the tool, and one line in the round's transcript (transcript.py). No call raises for a bad
request: arguments that do not fit, a held-out rollout, a path outside the harness repo, a
harness fault all come back as an error result with a named kind (registry.ERROR_KINDS).

What the Toolbox can touch (docs/design.md, "The tool surface"): it reads the store and never
writes it (the backtest engine indexes its own report, as in the loop); it writes candidate
branches through HarnessRepo.propose and never promotes, merges or reverts; it reads and writes
files only through the harness repo's commits and its own files under `<workdir>/agent/`; it
never returns a rollout of a held-out or validation task, nor a task's answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from evotrainer.config import GateConfig
from evotrainer.harness.repo import HarnessRepo
from evotrainer.store import Store, StoredRollout
from evotrainer.tools.registry import (
    BAD_ARGUMENTS,
    BUDGET_EXHAUSTED,
    FAILED,
    NOT_FOUND,
    REFUSED,
    TOOLS,
    UNKNOWN_TOOL,
    ToolError,
    check_args,
)
from evotrainer.tools.transcript import Transcript, clip, transcript_path
from evotrainer.workspace import Workspace

HIDDEN_SPLITS = ("heldout", "validation")
# Rollout meta that carries a task's answer or its hidden tests (train/recorder.py writes
# `answer`): never returned, never sent to the agent's analysis code.
SECRET_META = ("answer", "tests", "hidden_tests", "gold_patch", "solution")


class Toolbox:
    """The tools of one round of one run. A context manager: it closes its store."""

    def __init__(self, workdir: Path | str, run: str, round_index: int, *, max_calls: int = 50,
                 max_submissions: int = 1, gate: GateConfig | None = None, store_url: str | None = None,
                 workers: int | None = 1):
        from evotrainer.tools import act, read  # noqa: F401  (registers the tools)

        self.ws = Workspace(workdir)
        self.run, self.round = run, int(round_index)
        self.max_calls, self.max_submissions = int(max_calls), int(max_submissions)
        self.gate = gate or GateConfig()
        self.workers = workers
        self.store_url = store_url
        self.repo = HarnessRepo(self.ws.harnesses)
        self.store = Store.open(self.ws.root, store_url)
        run_id = self.store.run_id(run)
        if run_id is None:
            self.store.close()
            raise ValueError(f"no run {run!r} in the store of {self.ws.root}")
        self.run_id = run_id
        self.transcript = Transcript(transcript_path(self.ws.root, run, self.round))
        self.calls = 0  # calls answered, errors included
        self.refused_calls = 0  # calls refused because the budget was spent
        self.refused_answers = 0  # calls answered `refused` (the trust boundary); they count in `used`
        self._hidden: set[tuple[str, str]] | None = None

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()

    @property
    def agent_dir(self) -> Path:
        return self.ws.root / "agent" / self.run

    # ------------------------------------------------------------ the surface

    def specs(self, group: str | None = None) -> list[dict[str, Any]]:
        """Every tool as an OpenAI-compatible `tools` entry (optionally one group's)."""
        return [t.spec() for t in TOOLS.values() if group is None or t.group == group]

    def call(self, name: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one tool; always returns {"ok": True, "result": ...} or {"ok": False, "error": {...}}."""
        args = {} if args is None else args
        started = time.monotonic()
        if self.calls >= self.max_calls:
            self.refused_calls += 1
            out = _error(BUDGET_EXHAUSTED, f"the budget of {self.max_calls} tool calls is spent "
                                           f"({self.refused_calls} call(s) refused since)")
        else:
            self.calls += 1
            out = self._run(name, args)
            self.refused_answers += not out["ok"] and out["error"]["kind"] == REFUSED
        # `refused`: every call refused, at the trust boundary or past the budget
        out["calls"] = {"used": self.calls, "max": self.max_calls,
                        "refused": self.refused_answers + self.refused_calls}
        self.transcript.append({"seq": self.calls + self.refused_calls, "tool": name, "args": clip(args),
                                "ok": out["ok"], **({"result": clip(out["result"])} if out["ok"]
                                                    else {"error": out["error"]}),
                                "elapsed_s": round(time.monotonic() - started, 4)})
        return out

    def _run(self, name: str, args: Any) -> dict[str, Any]:
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            return _error(UNKNOWN_TOOL, f"no tool {name!r}; tools: {', '.join(TOOLS)}")
        try:
            check_args(tool.schema, args)
            return {"ok": True, "result": tool.fn(self, **args)}
        except ToolError as exc:
            return _error(exc.kind, str(exc))
        except Exception as exc:  # a tool's fault is the round's data, not its end
            from evotrainer.harness.redact import redact

            return _error(FAILED, f"{name}: {type(exc).__name__}: {redact(exc)}")

    # ------------------------------------------------------------ helpers the tools share

    def round_ids(self) -> dict[int, int]:
        """{round id: round index} of the run's rounds."""
        return {r["id"]: r["index"] for r in self.store.rounds(self.run_id)}

    def check_round(self, index: int | None) -> int:
        index = self.round if index is None else index
        if index not in self.round_ids().values():
            raise ToolError(NOT_FOUND, f"run {self.run!r} has no round {index} "
                                       f"(rounds: {sorted(self.round_ids().values())})")
        return index

    def hidden(self, sr: StoredRollout) -> bool:
        """A rollout of a held-out or validation task, by the task table or by its own meta."""
        if self._hidden is None:
            self._hidden = {key for split in HIDDEN_SPLITS for key in self.store.task_keys(split)}
        r = sr.rollout
        return (r.domain, r.task_id) in self._hidden or (r.meta or {}).get("split") in HIDDEN_SPLITS

    def rollouts(self, round_index: int | None = None, kind: str | None = None) -> Iterator[StoredRollout]:
        """The run's rollouts the agent may see (one round's, or all), never a hidden one."""
        for sr in self.store.iter_rollouts(run_id=self.run_id, round_index=round_index, kind=kind):
            if not self.hidden(sr):
                yield sr


def public_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (meta or {}).items() if k not in SECRET_META}


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"kind": kind, "message": message}}


def bad(message: str) -> ToolError:
    return ToolError(BAD_ARGUMENTS, message)
