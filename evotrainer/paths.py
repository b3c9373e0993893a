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
