"""The `rules` distiller: lessons from the verified outcome kinds and flags of failed rollouts.

Each rule names a failure signature the trusted checkers of evotrainer/domains emit (kind plus
flags) and the lesson that answers it. Some rules also need contrast from the group: a
successful sibling (same task, same round) shows the task was solvable, or shows the habit the
failure lacked (`sibling_flag`). A rule becomes a lesson once `min_support` failures match it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evotrainer.api import Rollout
from evotrainer.experience.distill import LessonDraft, register_distiller
from evotrainer.store import StoredRollout


@dataclass(frozen=True)
class Rule:
    name: str
    domains: tuple[str, ...]  # () = every domain
    kinds: tuple[str, ...]  # outcome kinds it matches; () = any failure
    text: str
    flags: tuple[str, ...] = ()  # all of these must be set
    without: tuple[str, ...] = ()  # none of these may be set
    partial: bool = False  # only failures that passed some tests (0 < score < 1)
    contrast: bool = False  # needs a successful sibling in the group
    sibling_flag: str | None = None  # ... that carries this flag

    def matches(self, r: Rollout) -> bool:
        o = r.outcome
        if o.success or (self.domains and r.domain not in self.domains):
            return False
        if self.kinds and o.kind not in self.kinds:
            return False
        if not set(self.flags) <= set(o.flags) or set(self.without) & set(o.flags):
            return False
        return not self.partial or 0.0 < o.score < 1.0

    def contrasted(self, group: Sequence[Rollout]) -> bool:
        if not self.contrast and self.sibling_flag is None:
            return True
        return any(r.outcome.success and (self.sibling_flag is None or self.sibling_flag in r.outcome.flags)
                   for r in group)


MATH, CODE, SWE = ("math",), ("code",), ("swe",)

# Signatures from domains/math.py (check_answer), domains/code.py (check_code), domains/swe.py
# (check_edit) and grade/grader.py. Texts speak to the policy, in the imperative.
RULES: tuple[Rule, ...] = (
    Rule("math_format", MATH, ("format_error",),
         "End every solution with the final number in the form 'Answer: <number>'; a reply with no "
         "number in it gets no credit."),
    Rule("math_truncated", MATH, ("truncated",),
         "Keep the working short and write 'Answer: <number>' before running out of room; a reply cut "
         "off before its final answer gets no credit."),
    Rule("math_marker", MATH, ("wrong",),
         "Mark the final result explicitly as 'Answer: <number>'; without the marker the last number "
         "written is taken as the answer.", without=("answer_marker",), sibling_flag="answer_marker"),
    Rule("math_recheck", MATH, ("wrong",),
         "Recheck every arithmetic step before giving the answer: other attempts at the same problem "
         "got it right.", contrast=True),
    Rule("code_format", CODE, ("format_error",),
         "Put the whole solution in one ```python code block that defines the required function."),
    Rule("code_truncated", CODE, ("truncated",),
         "Keep the code short and close the code block; a solution cut off mid-code fails."),
    Rule("code_syntax", CODE, ("wrong",),
         "Make sure the code is valid Python (indentation, brackets, colons) before finishing.",
         flags=("syntax_error",)),
    Rule("code_entry_point", CODE, (),
         "Define the function with exactly the name and arguments the task asks for.",
         flags=("missing_entry_point",)),
    Rule("code_load", CODE, ("wrong",),
         "The code must import cleanly: only definitions and the imports it needs, no input() and no "
         "top-level calls.", flags=("load_error",)),
    Rule("code_timeout", CODE, ("timeout",),
         "Avoid endless loops and very slow algorithms: the hidden tests run under a time limit."),
    Rule("code_edge_cases", CODE, ("wrong",),
         "Handle the edge cases (empty input, zero, negative numbers, duplicates): a solution that "
         "passes only some hidden tests gets no credit.", partial=True),
    Rule("code_tampering", CODE, ("tampering",),
         "Only solve the task: code that touches files, processes or the test runner is rejected."),
    Rule("swe_format", SWE, ("format_error",),
         "Answer only with SEARCH/REPLACE blocks: the file path on its own line, then '<<<<<<< SEARCH', "
         "lines copied from the file, '=======', the fixed lines, '>>>>>>> REPLACE'."),
    Rule("swe_search_exact", SWE, ("patch_failed",),
         "The SEARCH text must match the file exactly: copy the lines character for character, "
         "indentation included, or the patch fails to apply.", flags=("search_not_found",)),
    Rule("swe_search_unique", SWE, ("patch_failed",),
         "Quote enough lines in SEARCH, with their exact indentation, that they match one place only.",
         flags=("ambiguous_search",)),
    Rule("swe_missing_file", SWE, ("patch_failed",),
         "Use the file path exactly as the prompt shows it; an edit to a file that does not exist fails.",
         flags=("missing_file",)),
    Rule("swe_empty_search", SWE, ("patch_failed",),
         "Never leave SEARCH empty for an existing file: quote the lines to replace.",
         flags=("empty_search",)),
    Rule("swe_no_change", SWE, ("empty",),
         "The REPLACE lines must differ from the SEARCH lines; an edit that changes nothing fixes nothing.",
         flags=("no_change",)),
    Rule("swe_regression", SWE, ("wrong",),
         "Change only what the bug needs: a fix that breaks tests which passed before is not a fix.",
         flags=("p2p_broken",)),
    Rule("swe_incomplete", SWE, ("wrong",),
         "The fix must make every failing test pass: look for each place the bug shows before answering.",
         flags=("f2p_partial",)),
    Rule("swe_tampering", SWE, (),
         "Never edit test files, test configuration or paths outside the repository: such edits are "
         "dropped and flagged.", flags=("tampering",)),
    Rule("swe_truncated", SWE, ("truncated",),
         "Keep SEARCH blocks short, only the few lines around the bug, so the reply ends before the "
         "length limit."),
    Rule("empty", (), ("empty",),
         "Never give an empty reply: always answer in the format the task asks for.", without=("no_change",)),
)


@register_distiller("rules")
class RuleDistiller:
    """Counts each rule's matching failures across groups; a rule with enough becomes a lesson."""

    name = "rules"

    def __init__(self, min_support: int = 2, rules: Sequence[Rule] = RULES) -> None:
        if min_support < 1:
            raise ValueError("rules distiller: min_support must be >= 1")
        self.min_support = min_support
        self.rules = tuple(rules)

    def distill(self, domain: str, groups: Sequence[Sequence[StoredRollout]]) -> list[LessonDraft]:
        rules = [r for r in self.rules if not r.domains or domain in r.domains]
        hits: dict[str, list[str]] = {r.name: [] for r in rules}
        group_hits: dict[str, int] = dict.fromkeys(hits, 0)
        for group in groups:
            rollouts = [sr.rollout for sr in group]
            for rule in rules:
                matched = [r.id for r in rollouts if r.domain == domain and rule.matches(r)]
                if matched and rule.contrasted(rollouts):
                    hits[rule.name] += matched
                    group_hits[rule.name] += 1
        drafts = [
            LessonDraft(domain=domain, text=rule.text, source=self.name, kind=rule.name,
                        support=len(hits[rule.name]), evidence=tuple(hits[rule.name]),
                        meta={"rule": rule.name, "groups": group_hits[rule.name]})
            for rule in rules if len(hits[rule.name]) >= self.min_support
        ]
        return sorted(drafts, key=lambda d: (-d.support, d.kind))
