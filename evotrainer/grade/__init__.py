"""The trusted SWE grader: SWE-bench tasks (swe_tasks.py) and task packs (packs.py), diffs
(patch.py), grading (grader.py) and its cache (cache.py). Harness code never reaches any of it."""

from evotrainer.grade.cache import GradeCache, patch_digest
from evotrainer.grade.grader import GRADER_VERSION, GradeError, Grader, GradeResult, grade, is_test_path
from evotrainer.grade.patch import FilePatch, PatchError, UnsafePathError, apply_patch, make_patch, parse_patch
from evotrainer.grade.swe_tasks import SweTask, load_predictions, load_tasks, task_from_dict, write_tasks

__all__ = [
    "GRADER_VERSION",
    "FilePatch",
    "GradeCache",
    "GradeError",
    "GradeResult",
    "Grader",
    "PatchError",
    "SweTask",
    "UnsafePathError",
    "apply_patch",
    "grade",
    "is_test_path",
    "load_predictions",
    "load_tasks",
    "make_patch",
    "parse_patch",
    "patch_digest",
    "task_from_dict",
    "write_tasks",
]
