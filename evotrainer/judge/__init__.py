"""LLM judges: proxy verdicts (voting roles, review queue, verdict cache) and per-step GOOD/BAD labels."""

from evotrainer.judge.backends import BACKENDS, JudgeBackend, make_backend, register_backend
from evotrainer.judge.panel import LABELS, JudgePanel, PanelResult, apply_human_label, decide
from evotrainer.judge.records import META_KEY, STEP_META_KEY, JudgeRecords, ReviewItem, StoredVerdict
from evotrainer.judge.runtime import Judge, JudgeResult
from evotrainer.judge.steps import StepJudge, split_steps
from evotrainer.judge.verdict import StepVerdict, Verdict, VerdictError, parse_step_verdict, parse_verdict

__all__ = ["BACKENDS", "Judge", "JudgeBackend", "JudgePanel", "JudgeRecords", "JudgeResult",
           "LABELS", "META_KEY", "PanelResult", "ReviewItem", "STEP_META_KEY", "StepJudge", "StepVerdict",
           "StoredVerdict", "Verdict", "VerdictError", "apply_human_label", "decide", "make_backend",
           "parse_step_verdict", "parse_verdict", "register_backend", "split_steps"]
