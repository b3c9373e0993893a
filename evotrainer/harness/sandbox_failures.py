"""What a sandboxed harness run can fail with: CandidateFailure (the harness's fault) or SandboxError (ours)."""

from __future__ import annotations

from evotrainer.errors import SandboxError, UserError
from evotrainer.harness.redact import redact


class CandidateFailure(UserError):
    """A harness fault that rejects that harness (not the run); `harness` is its label.

    The reason is redacted as it is made (evotrainer.harness.redact): it is text harness code
    could shape, and it flows into reports, the store and the LLM agent's prompt. The parent
    rebuilds every failure a worker reports, so the parent's own secrets are what it removes.
    """

    def __init__(self, reason: str, harness: str = "candidate"):
        reason, harness = redact(reason), redact(harness, limit=64)
        super().__init__(reason)
        self.reason = reason
        self.harness = harness

    def __reduce__(self):  # multi-argument exceptions need this to cross a process boundary
        return (CandidateFailure, (self.reason, self.harness))

    def __str__(self) -> str:
        return f"{self.harness} harness: {self.reason}"


__all__ = ["CandidateFailure", "SandboxError"]
