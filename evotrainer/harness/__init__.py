"""Harnesses: the untrusted, agent-editable training code, loaded and validated here."""

from evotrainer.harness.loader import (
    DIMENSIONS,
    HARNESS_FILES,
    Harness,
    HarnessError,
    HarnessSpec,
    Probe,
    load_harness,
    parse_spec,
    read_sources,
)

__all__ = [
    "DIMENSIONS",
    "HARNESS_FILES",
    "Harness",
    "HarnessError",
    "HarnessSpec",
    "Probe",
    "load_harness",
    "parse_spec",
    "read_sources",
]
