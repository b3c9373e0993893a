"""SWE task sets: bug synthesis from a real repo (synth.py, mutate.py), import of SWE-bench JSONL
(importer.py), task repositories (repos.py) and the bundled task pack (packs/)."""

from __future__ import annotations

from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent / "packs"


def pack_files(pack_dir: Path | str | None = None) -> list[Path]:
    """The task files of a pack folder (default: the bundled pack), sorted."""
    return sorted(Path(pack_dir or PACK_DIR).glob("*.jsonl"))


def load_pack(pack_dir: Path | str | None = None):
    """Every SweTask of a pack folder (default: the bundled pack)."""
    from evotrainer.grade import load_tasks

    return [t for f in pack_files(pack_dir) for t in load_tasks(f)]


__all__ = ["PACK_DIR", "pack_files", "load_pack"]
