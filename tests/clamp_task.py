"""The tiny real SWE task several tests share: clamp() with an off-by-one bug, its tests and fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

from evotrainer.grade import make_patch

CLEAN = textwrap.dedent('''\
    def clamp(x, lo, hi):
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x
    ''')
BUGGY = CLEAN.replace("if x > hi:", "if x >= hi + 1:")
TESTS = textwrap.dedent('''\
    from shapes import clamp


    def test_low():
        assert clamp(-1, 0, 10) == 0


    def test_high():
        assert clamp(10.5, 0, 10) == 10
    ''')
FIX = "shapes.py\n<<<<<<< SEARCH\n    if x >= hi + 1:\n=======\n    if x > hi:\n>>>>>>> REPLACE\n"


def clamp_repo(root: Path) -> Path:
    """The clean repo (the fix is in it; each task row's bug_patch makes the buggy state)."""
    root.mkdir(parents=True)
    (root / "shapes.py").write_text(CLEAN)
    (root / "test_shapes.py").write_text(TESTS)
    return root


def clamp_row(root: Path, instance_id: str = "shapes-1") -> dict:
    """A SWE-bench-format task row over `clamp_repo(root)`."""
    return {"instance_id": instance_id, "repo": str(root), "base_commit": "x",
            "patch": make_patch({"shapes.py": (BUGGY, CLEAN)}), "test_patch": "",
            "FAIL_TO_PASS": ["test_shapes.py::test_high"], "PASS_TO_PASS": ["test_shapes.py::test_low"],
            "problem_statement": "clamp(10.5, 0, 10) returns 10.5", "level": 0,
            "bug_patch": make_patch({"shapes.py": (CLEAN, BUGGY)}),
            "mutation": {"kind": "flip_compare", "path": "shapes.py", "function": "clamp", "line": 4,
                         "description": "x"}}
