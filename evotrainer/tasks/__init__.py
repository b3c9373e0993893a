"""SWE task sets: bug synthesis from a real repo (synth.py, mutate.py), import of SWE-bench JSONL
(importer.py), task repositories (repos.py), task packs (packs/) and fetching their library
sources (sources.py)."""

from __future__ import annotations

from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent / "packs"
PACKS: dict[str, Path] = {"bundled": PACK_DIR}  # named packs; any folder with sources.json works too


def resolve_pack(pack: Path | str | None = None) -> Path:
    """A pack's folder from its name ("bundled", the default) or path; ValueError if it is neither."""
    if pack is None or str(pack) in PACKS:
        return PACKS[str(pack or "bundled")]
    path = Path(pack).expanduser()
    if not path.is_dir():
        raise ValueError(f"task pack {str(pack)!r} is neither a pack name ({', '.join(PACKS)}) nor a folder")
    return path.resolve()


def pack_files(pack_dir: Path | str | None = None) -> list[Path]:
    """The task files of a pack folder (default: the bundled pack), sorted."""
    return sorted(Path(pack_dir or PACK_DIR).glob("*.jsonl"))


def load_pack(pack_dir: Path | str | None = None):
    """Every SweTask of a pack folder (default: the bundled pack), repos resolved in the fetched
    snapshot store; ValueError naming `evotrainer tasks fetch` when the sources are not fetched."""
    from evotrainer.grade import load_tasks

    return [t for f in pack_files(pack_dir) for t in load_tasks(f)]


__all__ = ["PACKS", "PACK_DIR", "load_pack", "pack_files", "resolve_pack"]
