"""The judge's rows in the store (evotrainer/store/judge.py) and the rollout meta keys it writes."""

from evotrainer.store.judge import JudgeRecords, ReviewItem, StoredVerdict

META_KEY = "judge"  # rollout.meta["judge"]: the panel's label, what a harness reads
STEP_META_KEY = "step_labels"  # rollout.meta["step_labels"]: one GOOD/BAD per assistant step

__all__ = ["JudgeRecords", "META_KEY", "ReviewItem", "STEP_META_KEY", "StoredVerdict"]
