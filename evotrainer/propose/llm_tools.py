"""The `llm` agent's tool-using mode: a chat model works one round through the tool surface
(evotrainer/tools) by OpenAI-compatible tool calling, and what it submits is the round's candidates.

The loop (`LLMToolAgent.work`): the playbook (templates/llm_playbook.md.j2) is the system message
and the round (templates/llm_round.md.j2, with the health report's summary) the user message;
every request carries `tools=Toolbox.specs()` plus `finish`. Each tool call of a response runs
through `Toolbox.call` (which checks, counts and records it) and goes back as a `tool` message,
cut to `max_result_chars`. The loop repeats until the model calls `finish` or answers without a
tool call, or a budget ends it: tool calls (the Toolbox's `max_calls`), tokens (the sum of
`usage.total_tokens` over the responses) or wall time. An endpoint error ends the round too.
Every ending is a named value (ENDINGS), counted in `endings`, written as the round transcript's
last line (`<workdir>/agent/<run>/round-<k>.jsonl`) and returned.

A bad call from the model (an unknown tool, arguments that are not JSON, arguments the schema
refuses) is answered with an error result and the loop goes on; so is a tool that fails. The
proposals are the candidates the model submitted (`read_submissions`): their branches exist
already, so each Proposal names its `branch` and the loop backtests that branch as it is.

What it simplifies: the whole conversation is resent on every request (no summarising of old
turns), so a long round is bounded by the token budget rather than by the context window.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.backtest.metrics import LOWER_IS_BETTER, SAFETY_METRICS
from evotrainer.chat import llm_endpoint, openai_client
from evotrainer.config import GateConfig
from evotrainer.harness.loader import GRPO_KEYS, HARNESS_FILES
from evotrainer.harness.repo import CANDIDATE_PREFIX, MAIN
from evotrainer.harness.sandbox import ALLOWED_MODULES
from evotrainer.propose.base import Evidence, Proposal, register_agent
from evotrainer.tools import Toolbox, read_submissions
from evotrainer.tools.registry import BAD_ARGUMENTS

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"

# How a round of the loop ends; each is a value to count, never a bare exception.
FINISHED = "finished"  # the model called `finish`
NO_TOOL_CALLS = "no_tool_calls"  # the model answered without a tool call
BUDGET_CALLS = "budget_calls"  # the Toolbox's max_calls is spent
BUDGET_TOKENS = "budget_tokens"  # the responses' total_tokens reached max_total_tokens
BUDGET_TIME = "budget_time"  # max_seconds of wall time passed
ENDPOINT_ERROR = "endpoint_error"  # the endpoint failed (after the SDK's retries) or sent no choice
ALREADY_SUBMITTED = "already_submitted"  # a resumed round: its submissions stand, the loop does not rerun
INTERRUPTED = "interrupted"  # an exception from outside the loop's own handling (recorded, then raised)
ENDINGS = (FINISHED, NO_TOOL_CALLS, BUDGET_CALLS, BUDGET_TOKENS, BUDGET_TIME, ENDPOINT_ERROR, ALREADY_SUBMITTED,
           INTERRUPTED)

FINISH = "finish"
FINISH_SPEC = {"type": "function", "function": {
    "name": FINISH,
    "description": "End the round once you have submitted what you mean to submit (or decided on nothing).",
    "parameters": {"type": "object", "properties": {"summary": {"type": "string", "description": "one line"}},
                   "required": [], "additionalProperties": False}}}


@dataclass
class ToolRound:
    """What one round of the loop did and how it ended."""

    ending: str  # one of ENDINGS
    detail: str  # why, in words
    turns: int = 0  # chat completions answered
    tool_calls: int = 0  # calls the model made, `finish` included
    bad_calls: int = 0  # calls answered with an error result
    tokens: int = 0  # sum of usage.total_tokens
    seconds: float = 0.0
    submitted: list[str] = field(default_factory=list)  # the branches submitted, in order

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@register_agent("llm-tools")
class LLMToolAgent:
    """The `llm` agent in tools mode (`coevolve.llm.mode: tools`): a tool-calling loop per round."""

    name = "llm-tools"

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, temperature: float = 0.2, timeout_s: float = 120.0,
                 max_reply_tokens: int | None = None, max_calls: int = 40, max_total_tokens: int = 400_000,
                 max_seconds: float = 1800.0, max_submissions: int = 1, max_result_chars: int = 12_000,
                 max_report_chars: int = 6_000, endpoint_retries: int = 2, gate: GateConfig | None = None,
                 workers: int | None = 1, store_url: str | None = None) -> None:
        """The endpoint as for the one-shot agent (propose/llm.py): each option, else the
        environment (EVOTRAINER_LLM_BASE_URL, EVOTRAINER_LLM_MODEL, the key's variable)."""
        if min(max_calls, max_total_tokens, max_submissions, max_result_chars) < 1 or max_seconds <= 0:
            raise ValueError("llm agent (tools): every budget must be positive")
        self.base_url, self.model, key = llm_endpoint(base_url, model, api_key, api_key_env)
        self.client = openai_client(
            "llm agent", self.base_url, self.model, key, timeout_s,
            model_hint="set coevolve.llm.model or EVOTRAINER_LLM_MODEL",
            key_hint="set EVOTRAINER_LLM_API_KEY or OPENAI_API_KEY (or coevolve.llm.api_key_env), or a "
                     "base_url for a local endpoint").with_options(max_retries=endpoint_retries)
        self.temperature, self.max_reply_tokens = temperature, max_reply_tokens
        self.max_calls, self.max_total_tokens, self.max_seconds = max_calls, max_total_tokens, max_seconds
        self.max_submissions, self.max_result_chars = max_submissions, max_result_chars
        self.max_report_chars = max_report_chars
        self.gate, self.workers, self.store_url = gate or GateConfig(), workers, store_url
        self.templates = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                                     keep_trailing_newline=True, autoescape=False, trim_blocks=True,
                                     lstrip_blocks=True)
        self.endings: Counter[str] = Counter()  # over every round this agent worked
        self.last_round: ToolRound | None = None
        self.last_messages: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"LLMToolAgent(model={self.model!r}, base_url={self.base_url!r})"

    # -------------------------------------------------------- the Agent protocol

    def propose(self, evidence: Evidence, harness: Mapping[str, str], skills: Sequence[Any]) -> list[Proposal]:
        """Work the round through the tools; the submitted candidates, each naming its branch.
        `harness` and `skills` are not used: the model reads both through the tools."""
        if evidence.workdir is None or not evidence.run:
            raise ValueError("llm agent (tools): the evidence names no workspace and run to open the tools on")
        with Toolbox(evidence.workdir, evidence.run, evidence.round_index, max_calls=self.max_calls,
                     max_submissions=self.max_submissions, gate=self.gate, workers=self.workers,
                     store_url=self.store_url) as tb:
            self.last_round = self.work(tb, evidence)
            return submitted_proposals(tb)

    # -------------------------------------------------------- the loop

    def work(self, tb: Toolbox, evidence: Evidence) -> ToolRound:
        """One round: requests, tool calls and results until an ending; recorded and returned."""
        import openai

        started = time.monotonic()
        done = read_submissions(tb.ws.root, tb.run, tb.round)
        if done:  # a resumed propose stage: the model's earlier round stands
            return self._end(tb, ToolRound(ALREADY_SUBMITTED, f"round {tb.round} already has {len(done)} "
                                                              "submission(s)"), started)
        result = ToolRound(INTERRUPTED, "")  # every way out of the loop below names its ending
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.render_playbook(tb, evidence)},
            {"role": "user", "content": self.render_round(tb, evidence)}]
        self.last_messages = messages
        tools = [*tb.specs(), FINISH_SPEC]
        tb.transcript.append({"event": "start", "agent": self.name, "model": self.model,
                              "budgets": {"calls": tb.max_calls, "tokens": self.max_total_tokens,
                                          "seconds": self.max_seconds, "submissions": tb.max_submissions}})
        extra = {"max_tokens": self.max_reply_tokens} if self.max_reply_tokens else {}
        try:
            while True:
                if time.monotonic() - started >= self.max_seconds:
                    result.ending, result.detail = BUDGET_TIME, f"{self.max_seconds:g} s of wall time passed"
                    break
                try:
                    response = self.client.chat.completions.create(
                        model=self.model, messages=cast(Any, messages), tools=cast(Any, tools),
                        temperature=self.temperature, **extra)
                except openai.OpenAIError as exc:
                    result.ending = ENDPOINT_ERROR
                    result.detail = f"chat completion at {self.base_url or 'the OpenAI API'} failed: {exc}"
                    break
                result.turns += 1
                usage = getattr(response, "usage", None)
                result.tokens += int(getattr(usage, "total_tokens", 0) or 0)
                if not response.choices:
                    result.ending, result.detail = ENDPOINT_ERROR, "the response has no choices"
                    break
                choice = response.choices[0]
                message = choice.message
                calls = [c for c in (message.tool_calls or []) if getattr(c, "function", None) is not None]
                tb.transcript.append({"event": "turn", "turn": result.turns, "finish_reason": choice.finish_reason,
                                      "content": _cut(message.content or "", 2000),
                                      "tool_calls": [c.function.name for c in calls],
                                      "tokens": result.tokens})
                if result.tokens >= self.max_total_tokens:  # this response's calls are not run
                    result.ending = BUDGET_TOKENS
                    result.detail = f"{result.tokens} tokens used of {self.max_total_tokens}"
                    break
                if not calls:
                    result.ending = NO_TOOL_CALLS
                    result.detail = f"a reply without a tool call (finish_reason {choice.finish_reason})"
                    break
                messages.append({"role": "assistant", "content": message.content, "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    for c in calls]})
                finished = None
                for c in calls:
                    fn = c.function
                    result.tool_calls += 1
                    if fn.name == FINISH:
                        finished = _finish_summary(fn.arguments)
                        out: dict[str, Any] = {"ok": True, "result": "the round ends"}
                    else:
                        out = self.call(tb, fn.name, fn.arguments)
                    result.bad_calls += not out["ok"]
                    messages.append({"role": "tool", "tool_call_id": c.id,
                                     "content": _cut(json.dumps(out, default=str), self.max_result_chars)})
                if finished is not None:
                    result.ending, result.detail = FINISHED, finished or "the model called finish"
                    break
                if tb.calls >= tb.max_calls:
                    result.ending, result.detail = BUDGET_CALLS, f"{tb.calls} tool calls of {tb.max_calls}"
                    break
        except BaseException as exc:
            result.ending, result.detail = INTERRUPTED, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._end(tb, result, started)
        return result

    def call(self, tb: Toolbox, name: str, arguments: str | None) -> dict[str, Any]:
        """One tool call as the model sent it: its arguments are a JSON string."""
        text = (arguments or "").strip()
        try:
            args = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            # The raw text goes to the Toolbox as it came, so the call is counted and recorded like
            # any other; its schema check answers bad_arguments (or unknown_tool first).
            out = tb.call(name, cast(Any, arguments))
            if not out["ok"] and out["error"]["kind"] == BAD_ARGUMENTS:
                out["error"]["message"] += (f" (the arguments are not JSON: {exc.msg} at column {exc.colno}; "
                                            "send one JSON object)")
            return out
        return tb.call(name, args)

    def _end(self, tb: Toolbox, result: ToolRound, started: float) -> ToolRound:
        result.seconds = round(time.monotonic() - started, 3)
        result.submitted = [s["branch"] for s in read_submissions(tb.ws.root, tb.run, tb.round)]
        self.endings[result.ending] += 1
        tb.transcript.append({"event": "end", **result.to_json(),
                              "toolbox": {"calls": tb.calls, "refused": tb.refused_calls}})
        log.info("llm agent (tools): round %s ended %s: %s", tb.round, result.ending, result.detail)
        return result

    # -------------------------------------------------------- the prompts

    def render_playbook(self, tb: Toolbox, evidence: Evidence) -> str:
        return self.templates.get_template("llm_playbook.md.j2").render(
            domain=evidence.domain, run=tb.run, round_index=tb.round, max_submissions=tb.max_submissions,
            max_calls=tb.max_calls, max_total_tokens=self.max_total_tokens,
            max_minutes=f"{self.max_seconds / 60:g}", max_result_chars=self.max_result_chars,
            grpo_keys=[f"{k.name} ({k.bounds()})" for k in GRPO_KEYS.values()],
            metrics=[{"name": m, "better": "lower" if low else "higher", "safety": m in SAFETY_METRICS}
                     for m, low in LOWER_IS_BETTER.items()],
            harness_names=list(HARNESS_FILES), allowed_modules=sorted(ALLOWED_MODULES))

    def render_round(self, tb: Toolbox, evidence: Evidence) -> str:
        from evotrainer.propose.llm import report_markdown

        text = report_markdown(evidence.report, "(no health report: call `health_report`)")
        return self.templates.get_template("llm_round.md.j2").render(
            domain=evidence.domain, run=tb.run, round_index=tb.round, max_submissions=tb.max_submissions,
            report=_cut(text.strip(), self.max_report_chars))


def submitted_proposals(tb: Toolbox) -> list[Proposal]:
    """The round's submissions as Proposals naming their branches: edits are the files that differ
    from main, diagnosis, targets and expected the head commit's trailers."""
    main = tb.repo.sources(MAIN)
    prefix = f"{CANDIDATE_PREFIX}{tb.round}-"
    existing = set(tb.repo.candidates())
    proposals = []
    for s in read_submissions(tb.ws.root, tb.run, tb.round):
        branch = s["branch"]
        if branch not in existing:
            log.warning("llm agent (tools): submitted branch %s no longer exists", branch)
            continue
        head = tb.repo.log(rev=f"refs/heads/{branch}", limit=1)[0]
        edits = {n: t for n, t in tb.repo.sources(branch).items() if main.get(n) != t}
        proposals.append(Proposal(slug=branch.removeprefix(prefix), diagnosis=head.trailers.get("Diagnosis", ""),
                                  edits=edits, targets=head.trailers.get("Targets") or s.get("targets") or "",
                                  expected=head.trailers.get("Expected", ""), branch=branch))
    return proposals


def _finish_summary(arguments: str | None) -> str:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return ""
    return str(value.get("summary") or "") if isinstance(value, dict) else ""


def _cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and a note of how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... cut: {limit} of {len(text)} characters shown]"


__all__ = ["ENDINGS", "FINISH", "LLMToolAgent", "ToolRound", "submitted_proposals"]
