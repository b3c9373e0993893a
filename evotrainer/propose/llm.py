"""The `llm` outer agent: a chat model behind any OpenAI-compatible endpoint proposes harness edits.

One call renders `templates/llm_propose.md.j2` (health report, failing rollouts, harness source,
skills, metric names, rules, reply schema) and asks for JSON proposals made of search/replace
edits. Each proposal is checked before it is returned: the schema, the files it touches (only
files at the harness root; anything else is refused and never applied), the targeted metric, the
edits (each `search` must occur exactly once), and that the edited harness still loads. Loading
runs in a sandbox worker, because the code is model-written. A reply that fails a check is sent
back with the errors (`templates/llm_retry.md.j2`) up to `max_retries` times, then skipped; every
reason lands in `last_errors`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from evotrainer.api.probes import JUDGED_BY
from evotrainer.backtest.metrics import LOWER_IS_BETTER, SAFETY_METRICS
from evotrainer.chat import EndpointError, ReplyError, llm_endpoint, openai_client, reply_json
from evotrainer.errors import EvotrainerError
from evotrainer.harness.loader import (
    CODE_FILES,
    GRPO_KEYS,
    HARNESS_FILES,
    SPEC_FILE,
    HarnessError,
    check_imports,
    parse_spec,
)
from evotrainer.harness.sandbox import ALLOWED_MODULES, CandidateFailure, SandboxLimits, SandboxPool
from evotrainer.propose.base import Evidence, Proposal, register_agent

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
# A harness file name: one plain name at the harness root. Everything else (a '/', '\\', '..',
# a leading '.' as in .git or .gitattributes, an absolute path) is refused.
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


class Refused(EvotrainerError, ValueError):
    """A proposal that edits a file outside the harness root: dropped, never retried or applied."""


@dataclass(frozen=True)
class _LoadOnly:
    """The sandbox job for a load check: entering the pool loads the harness; nothing else runs."""

    def open(self, trusted_io: Any = None) -> None:
        return None

    def run(self, state: Any, harnesses: Mapping[str, Any], message: Any) -> None:
        return None


# ---------------------------------------------------------------- reading a reply


def parse_reply(text: str) -> list[dict[str, Any]]:
    """The proposal objects of a reply: bare JSON, or JSON in a ```json fence."""
    text = (text or "").strip()
    if not text:
        raise ReplyError("the reply is empty; reply with one JSON object {\"proposals\": [...]}")
    data, problem = reply_json(text)
    if problem is not None:
        raise ReplyError(f"the reply is not JSON ({problem}); reply with one JSON object "
                         "{\"proposals\": [...]} and nothing else")
    if not isinstance(data, dict) or not isinstance(data.get("proposals"), list):
        raise ReplyError("the reply must be a JSON object with a \"proposals\" list, "
                         f"got {_kind(data)}" + ("" if not isinstance(data, dict) else
                                                 f" with keys {sorted(data)}"))
    return data["proposals"]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


def _string(raw: Mapping[str, Any], key: str, where: str, allow_empty: bool = False) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        wanted = "a string" if allow_empty else "a non-empty string"
        raise ReplyError(f"{where}.{key} must be {wanted}, got {_kind(value) if key in raw else 'nothing'}")
    return value


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48].strip("-")


def path_problem(name: Any) -> str | None:
    """Why `name` is not a file at the harness root (None when it is one)."""
    if not isinstance(name, str) or not name:
        return "the file name is empty"
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return f"{name!r} is an absolute path"
    if "/" in name or "\\" in name:
        return f"{name!r} is not at the harness root"
    if name.startswith("."):
        return f"{name!r} is a hidden file (such as .git), not a harness file"
    if not _FILE_NAME.match(name):
        return f"{name!r} is not a plain file name"
    return None


def apply_edits(sources: Mapping[str, str], edits: Sequence[Mapping[str, str]], where: str) -> dict[str, str]:
    """The full new text of every file the edits change (search/replace, in order)."""
    texts: dict[str, str] = {}
    for i, edit in enumerate(edits):
        at = f"{where}.edits[{i}]"
        name, search, replace = edit["file"], edit["search"], edit["replace"]
        current = texts.get(name, sources.get(name))
        if current is None:
            if search:
                raise ReplyError(f"{at}: {name} does not exist; to create it, give an empty search")
            texts[name] = replace
            continue
        if not search:
            raise ReplyError(f"{at}: search is empty but {name} exists; quote the text to replace")
        count = current.count(search)
        if count != 1:
            what = "does not occur" if count == 0 else f"occurs {count} times"
            raise ReplyError(f"{at}: the search text {what} in {name}; copy it verbatim from the "
                             "current file (whitespace included) and quote enough lines to make it unique")
        texts[name] = current.replace(search, replace, 1)
    changed = {name: text for name, text in texts.items() if text != sources.get(name)}
    if not changed:
        raise ReplyError(f"{where}: the edits change nothing")
    return changed


# ---------------------------------------------------------------- the agent


@register_agent("llm")
class LLMAgent:
    """Proposals from a chat model behind an OpenAI-compatible `/v1/chat/completions` endpoint."""

    name = "llm"

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, max_retries: int = 2, temperature: float = 0.7,
                 timeout_s: float = 120.0, max_proposals: int = 3, max_tokens: int | None = None,
                 max_samples: int = 6, max_chars: int = 1200, max_skills: int = 12,
                 load_timeout_s: float = 60.0) -> None:
        """Options not given come from the environment: EVOTRAINER_LLM_BASE_URL (else
        OPENAI_BASE_URL), EVOTRAINER_LLM_MODEL, and the key from `api_key`, else the variable
        named by `api_key_env`, else EVOTRAINER_LLM_API_KEY, else OPENAI_API_KEY. A local endpoint
        (a base URL is set) may need no key."""
        self.base_url, self.model, key = llm_endpoint(base_url, model, api_key, api_key_env)
        self.client = openai_client(
            "llm agent", self.base_url, self.model, key, timeout_s,
            model_hint="set agent.llm.model or EVOTRAINER_LLM_MODEL",
            key_hint="set EVOTRAINER_LLM_API_KEY or OPENAI_API_KEY (or agent.llm.api_key_env), or a "
                     "base_url for a local endpoint")
        if max_retries < 0 or max_proposals < 1:
            raise ValueError("llm agent: max_retries must be >= 0 and max_proposals >= 1")
        self.max_retries, self.temperature, self.timeout_s = max_retries, temperature, timeout_s
        self.max_proposals, self.max_tokens = max_proposals, max_tokens
        self.max_samples, self.max_chars, self.max_skills = max_samples, max_chars, max_skills
        self.load_timeout_s = load_timeout_s
        self.templates = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                                     keep_trailing_newline=True, autoescape=False,
                                     trim_blocks=True, lstrip_blocks=True)
        self.last_errors: list[str] = []  # why replies or proposals were retried, skipped or refused
        self.last_messages: list[dict[str, str]] = []  # the last conversation, for the record

    def __repr__(self) -> str:
        return f"LLMAgent(model={self.model!r}, base_url={self.base_url!r})"

    # -------------------------------------------------------- the loop

    def propose(self, evidence: Evidence, harness: Mapping[str, str], skills: Sequence[Any]) -> list[Proposal]:
        sources = dict(harness)
        messages = [{"role": "user", "content": self.render_prompt(evidence, sources, skills)}]
        self.last_errors, self.last_messages = [], messages
        accepted: dict[str, Proposal] = {}
        refused: list[str] = []
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            text, finish = self._complete(messages)
            messages.append({"role": "assistant", "content": text})
            errors = self._read(text, sources, accepted, refused)
            if errors and finish == "length":
                errors.append("your reply was cut off at the token limit; send fewer or shorter proposals")
            if not errors or len(accepted) >= self.max_proposals:
                break
            self.last_errors += [f"attempt {attempt}: {e}" for e in errors]
            if attempt == attempts:
                reason = f"skipped after {attempts} attempts: {'; '.join(errors)}"
                self.last_errors.append(reason)
                log.warning("llm agent: %s", reason)
                break
            retry = self.templates.get_template("llm_retry.md.j2")
            messages.append({"role": "user", "content": retry.render(
                errors=errors, accepted=list(accepted), refused=refused)})
        return list(accepted.values())

    def _read(self, text: str, sources: Mapping[str, str], accepted: dict[str, Proposal],
              refused: list[str]) -> list[str]:
        """Add the reply's usable proposals to `accepted`; return what was wrong with the rest."""
        try:
            raws = parse_reply(text)
        except ReplyError as exc:
            return [str(exc)]
        errors = []
        for i, raw in enumerate(raws):
            if len(accepted) >= self.max_proposals:
                self.last_errors.append(f"dropped proposals beyond max_proposals={self.max_proposals}")
                break
            try:
                proposal = self.check(raw, sources, f"proposals[{i}]")
            except Refused as exc:
                reason = f"refused {exc}"
                refused.append(str(exc))
                self.last_errors.append(reason)
                log.warning("llm agent: %s", reason)
                continue
            except ReplyError as exc:
                errors.append(str(exc))
                continue
            earlier = accepted.get(proposal.slug)
            if earlier is not None and earlier.edits != proposal.edits:
                errors.append(f"proposals[{i}]: slug {proposal.slug!r} is already taken; choose another")
            elif earlier is None and any(p.edits == proposal.edits for p in accepted.values()):
                self.last_errors.append(f"dropped {proposal.slug!r}: the same edits as an accepted proposal")
            else:
                accepted[proposal.slug] = proposal
        return errors

    def check(self, raw: Any, sources: Mapping[str, str], where: str = "proposal") -> Proposal:
        """One reply proposal as a Proposal with full-file edits; Refused or ReplyError if unusable."""
        if not isinstance(raw, dict):
            raise ReplyError(f"{where} must be an object, got {_kind(raw)}")
        slug = slugify(_string(raw, "slug", where))
        if not slug:
            raise ReplyError(f"{where}.slug must contain letters or digits")
        where = f"proposal {slug!r}"
        edits = raw.get("edits")
        if not isinstance(edits, list) or not edits:
            raise ReplyError(f"{where}.edits must be a non-empty list of {{file, search, replace}}")
        for i, edit in enumerate(edits):
            if not isinstance(edit, dict):
                raise ReplyError(f"{where}.edits[{i}] must be an object {{file, search, replace}}, got {_kind(edit)}")
            _string(edit, "file", f"{where}.edits[{i}]")
        for i, edit in enumerate(edits):  # refuse before the edits are looked at any further
            problem = path_problem(edit["file"])
            if problem is not None:
                raise Refused(f"{where}: edits[{i}]: {problem}; only files at the harness root may be edited")
        for i, edit in enumerate(edits):
            for key in ("search", "replace"):
                _string(edit, key, f"{where}.edits[{i}]", allow_empty=True)
        targets = _string(raw, "targets", where).strip()
        if targets not in LOWER_IS_BETTER and targets not in JUDGED_BY:  # a probe: the loop names its metrics
            raise ReplyError(f"{where}.targets: unknown metric {targets!r}; use one of "
                             f"{', '.join(LOWER_IS_BETTER)}, or the name of the alerting probe it repairs")
        diagnosis, expected = _string(raw, "diagnosis", where), _string(raw, "expected", where)
        changed = apply_edits(sources, edits, where)
        self._check_loads({**sources, **changed}, changed, where)
        return Proposal(slug=slug, diagnosis=diagnosis.strip(), edits=changed, targets=targets,
                        expected=expected.strip())

    def _check_loads(self, sources: Mapping[str, str], changed: Mapping[str, str], where: str) -> None:
        """Static checks here (parsing only), then a real load in a sandbox worker."""
        try:
            for name, text in changed.items():
                if name == SPEC_FILE:
                    parse_spec(text)
                elif name in CODE_FILES:
                    check_imports(text, name)
        except HarnessError as exc:
            raise ReplyError(f"{where}: the edited harness does not load: {exc}") from None
        if not set(changed) & set(HARNESS_FILES):
            return  # a new file only: nothing loads it
        limits = SandboxLimits(load_timeout_s=self.load_timeout_s)
        try:
            with SandboxPool([("candidate", sources)], _LoadOnly(), limits=limits):
                pass
        except CandidateFailure as exc:
            raise ReplyError(f"{where}: the edited harness does not load: {exc.reason}") from None

    def _complete(self, messages: list[dict[str, str]]) -> tuple[str, str | None]:
        import openai

        extra = {"max_tokens": self.max_tokens} if self.max_tokens else {}
        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature, **extra)
        except openai.OpenAIError as exc:
            where = self.base_url or "the OpenAI API"
            raise EndpointError(f"llm agent: chat completion at {where} failed: {exc}") from exc
        if not response.choices:
            return "", None
        choice = response.choices[0]
        return choice.message.content or "", choice.finish_reason

    # -------------------------------------------------------- the prompt

    def render_prompt(self, evidence: Evidence, sources: Mapping[str, str], skills: Sequence[Any]) -> str:
        report_text = report_markdown(evidence.report, "(no health report)")
        order = [n for n in HARNESS_FILES if n in sources] + sorted(set(sources) - set(HARNESS_FILES))
        return self.templates.get_template("llm_propose.md.j2").render(
            domain=evidence.domain,
            round_index=evidence.round_index,
            max_proposals=self.max_proposals,
            report=report_text.strip(),
            samples=self._samples(evidence.samples),
            history=[json.dumps(dict(h), default=str, sort_keys=True) for h in list(evidence.history)[-5:]],
            harness_files=[(n, sources[n]) for n in order],
            harness_names=list(HARNESS_FILES),
            grpo_keys=[f"{k.name} ({k.bounds()})" for k in GRPO_KEYS.values()],
            skills=self._skills(skills, evidence.domain),
            metrics=[{"name": m, "better": "lower" if low else "higher", "safety": m in SAFETY_METRICS}
                     for m, low in LOWER_IS_BETTER.items()],
            allowed_modules=sorted(ALLOWED_MODULES),
        )

    def _samples(self, samples: Sequence[Any]) -> list[dict[str, Any]]:
        """StoredRollouts (or api.Rollouts), failing ones first, with long texts cut in the middle."""
        items = sorted(samples, key=lambda s: bool(getattr(s, "rollout", s).outcome.success))
        views = []
        for item in items[: self.max_samples]:
            r = getattr(item, "rollout", item)
            completion = r.completion or "\n".join(f"[{t.role}] {t.content}" for t in r.turns)
            reward = getattr(item, "reward", None)
            views.append({
                "task_id": r.task_id, "kind": r.outcome.kind, "success": r.outcome.success,
                "flags": list(r.outcome.flags), "truncated": r.truncated, "num_tokens": r.num_tokens,
                "reward": None if reward is None else round(float(reward), 4),
                "kept": getattr(item, "kept", None),
                "prompt": _clip(r.prompt, self.max_chars), "completion": _clip(completion, self.max_chars),
            })
        return views

    def _skills(self, skills: Sequence[Any], domain: str) -> list[dict[str, str]]:
        views = []
        for skill in skills:
            domains = _field(skill, "domains")
            if domains and domain not in domains:
                continue
            views.append({"name": _text(_field(skill, "name")) or "(unnamed)",
                          "summary": _text(_field(skill, "summary", "description", "intervention")),
                          "trigger": _text(_field(skill, "trigger")) or "(none given)",
                          "expected": _text(_field(skill, "expected", "expected_effect")) or "(none given)",
                          "status": _text(_field(skill, "status"))})
            if len(views) >= self.max_skills:
                break
        return views


def _field(obj: Any, *names: str) -> Any:
    for name in names:
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value not in (None, "", (), [], {}):
            return value
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    return _text(str(value))


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


def report_markdown(report: Any, missing: str) -> str:
    """The health report as the prompts show it (a HealthReport, or whatever text stands in)."""
    if report is None:
        return missing
    if callable(getattr(report, "to_markdown", None)):
        return report.to_markdown()
    return str(report)
