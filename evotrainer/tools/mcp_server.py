"""The Toolbox over the Model Context Protocol on stdio, so that any MCP client can be the outer agent.

    evotrainer mcp --workdir W          # run and round from W/coevolve.json

Each MCP tool is one Toolbox tool: the same name, description and input schema. A call returns
the Toolbox's JSON answer (`{"ok": ..., "result" | "error": ..., "calls": ...}`) as one text
block, with `isError` set when `ok` is false; the server adds no tool and no check of its own,
so the trust boundary is the Toolbox's (docs/design.md, "The tool surface").

The Toolbox is synchronous and not thread-safe (a backtest takes seconds), so it lives on one
worker thread of its own: it is opened, called and closed there, one call at a time, while the
event loop keeps answering the protocol.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotrainer.errors import UserError

SERVER_NAME = "evotrainer"


@dataclass(frozen=True)
class Session:
    """What one server serves: a round of a run in a workspace, and its budgets."""

    workdir: Path
    run: str
    round: int
    max_calls: int
    max_submissions: int
    gate: dict[str, Any]  # GateConfig as JSON, the loop's own when it wrote a session file
    store_url: str | None = None
    workers: int | None = 1


def resolve_round(workdir: Path, run: str | None, round_index: int | None) -> tuple[str, int]:
    """The run and round to serve: the flags, else the co-evolution run in `<workdir>/coevolve.json`
    and the round it is on (the one waiting for proposals while the loop's stage is `propose`).

    A run between rounds (stage `train`: the last round finished, the next not trained yet, which is
    how a finished `make train` leaves it) serves its last finished round. A workspace with no
    co-evolution run (rollouts imported from another trainer) serves the store's run, the one
    named by --run or the only one, at its last round."""
    from evotrainer.coevolve.state import RunState

    if run is not None and round_index is not None:
        return run, round_index
    path = workdir / "coevolve.json"
    state = RunState.load(path) if path.is_file() else None
    if state is None:
        return _store_round(workdir, run, round_index)
    if run is not None and run != state.run:
        raise UserError(f"--run {run!r}: {path} holds run {state.run!r}; pass --round too to serve another run")
    if round_index is not None:
        return state.run, round_index
    if state.stage == "train" and state.round > 0:
        return state.run, state.round - 1
    return state.run, state.round


def _store_round(workdir: Path, run: str | None, round_index: int | None) -> tuple[str, int]:
    """The run and round of a workspace whose store holds runs but no co-evolution state."""
    from evotrainer.store import Store
    from evotrainer.store.store import ABANDONED_SUFFIX

    if not (workdir / "store.db").is_file():
        raise UserError(f"{workdir}: no co-evolution run here (coevolve.json is missing) and no store: start one "
                        "with `evotrainer coevolve --agent external`, import rollouts with `evotrainer rollouts "
                        "import`, or pass --run and --round")
    with Store.open(workdir) as store:
        names = {name: rid for rid, name in store.run_names().items() if not name.endswith(ABANDONED_SUFFIX)}
        if run is None:
            if len(names) != 1:
                raise UserError(f"{workdir}: no co-evolution run here (coevolve.json is missing) and the store "
                                f"holds {len(names)} runs ({', '.join(sorted(names)) or 'none'}): pass --run, or start "
                                "one with `evotrainer coevolve --agent external`")
            [run] = names
        if run not in names:
            raise UserError(f"--run {run!r}: no such run in the store of {workdir} "
                            f"(runs: {', '.join(sorted(names)) or 'none'})")
        indices = [r["index"] for r in store.rounds(names[run])]
    if round_index is not None:
        return run, round_index
    if not indices:
        raise UserError(f"run {run!r} has no rounds in the store of {workdir}")
    return run, max(indices)


def tool_list() -> list[Any]:
    """Every Toolbox tool as an MCP Tool."""
    from mcp import types

    from evotrainer.tools import act, read  # noqa: F401  (registers the tools)
    from evotrainer.tools.registry import TOOLS

    return [types.Tool(name=t.name, description=t.description, inputSchema=dict(t.schema)) for t in TOOLS.values()]


def as_result(answer: dict[str, Any]) -> Any:
    """The Toolbox's answer as an MCP tool result: its JSON as text, an error when it is not ok."""
    from mcp import types

    text = json.dumps(answer, default=str)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=not answer["ok"])


class ToolboxThread:
    """A Toolbox opened, called and closed on one worker thread."""

    def __init__(self, session: Session):
        from evotrainer.config import GateConfig
        from evotrainer.tools.surface import Toolbox

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbox")
        self.toolbox = self.pool.submit(
            Toolbox, session.workdir, session.run, session.round, max_calls=session.max_calls,
            max_submissions=session.max_submissions, gate=GateConfig.model_validate(session.gate),
            store_url=session.store_url, workers=session.workers).result()

    async def call(self, name: str, args: Any) -> dict[str, Any]:
        return await asyncio.wrap_future(self.pool.submit(self.toolbox.call, name, args))

    def close(self) -> None:
        self.pool.submit(self.toolbox.close).result()
        self.pool.shutdown()


def build_server(tools: ToolboxThread, instructions: str) -> Any:
    from mcp import types
    from mcp.server.lowlevel import Server

    listed = tool_list()
    server: Any = Server(SERVER_NAME, instructions=instructions)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return listed

    # validate_input off: an unknown name or arguments that do not fit come back from the Toolbox
    # as named error results, logged in the transcript like every other call.
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        return as_result(await tools.call(name, arguments or {}))

    return server


def serve(session: Session) -> None:
    """Serve `session`'s tools on stdin/stdout until the client closes the connection."""
    import anyio
    from mcp.server.stdio import stdio_server

    tools = ToolboxThread(session)
    instructions = (f"Tools over round {session.round} of run {session.run!r} in {session.workdir}. "
                    f"Read {session.workdir / 'agent' / 'PLAYBOOK.md'} first when it exists. At most "
                    f"{session.max_calls} calls and {session.max_submissions} submission(s); call finish_round "
                    "when done.")
    server = build_server(tools, instructions)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(main)
    finally:
        tools.close()
