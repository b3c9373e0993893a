"""Where the shipped configs, seed harnesses and skills live, for a source checkout or an install."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# In a source checkout (the supported install is `pip install -e .`) the shipped folders sit
# beside the package; a wheel carries them inside it under `_shipped/`.
_ROOT = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "harnesses").is_dir() else PACKAGE_DIR / "_shipped"

CONFIGS_DIR = _ROOT / "configs"
HARNESSES_DIR = _ROOT / "harnesses"
SKILLS_DIR = _ROOT / "skills"
FAULT_CASES_DIR = _ROOT / "faults"  # the harness-fault benchmark's cases (evotrainer/faultbench)


def evotrainer_home() -> Path:
    """Where caches live (converted models, fetched SWE task sources): EVOTRAINER_HOME, else the
    user cache dir."""
    import os

    env = os.environ.get("EVOTRAINER_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("evotrainer"))
