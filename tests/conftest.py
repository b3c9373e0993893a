"""Shared fixtures. The embedded model is converted once per machine into EVOTRAINER_HOME (under a
lock, so parallel workers that start together convert it once).

`make test` runs the suite on pytest-xdist workers (`-n 2 --dist load --maxschedchunk 1`), each its
own process with these session fixtures of its own; every test makes its own temp folders, ports
(bound to 0), PostgreSQL server and browser profile, so none needs to share a worker. A test that
ever must (a fixed port, one folder) can carry `@pytest.mark.xdist_group("name")` and the run
`--dist loadgroup`.
"""

import os
import sys
import types
from pathlib import Path

import pytest

# `from tests.x import ...` means this folder. It is a namespace package, and a regular package
# named `tests` in site-packages wins over one (verl's wheel installs one): name ours first.
_here = str(Path(__file__).resolve().parent)
if _here not in list(getattr(sys.modules.get("tests"), "__path__", None) or ()):
    _tests = types.ModuleType("tests")
    _tests.__path__ = [_here]
    sys.modules["tests"] = _tests


@pytest.fixture(scope="session")
def embedded_model_dir():
    from evotrainer.policy.embedded import embedded_model_dir as convert

    return convert()


def _share_the_cores() -> None:
    """Each worker gets its share of the cores for torch (and for the processes it starts), so
    two workers on two cores do not each run two spinning threads on one core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, threads)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores()

# An xdist worker's environment says COLUMNS=80 and LINES=24 (execnet sets them): our consoles
# and the commands the tests start would then lay out for an 80-column terminal, which no run
# outside xdist does. Tests that want a width set COLUMNS themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)


def pytest_collection_modifyitems(config, items):
    """Under xdist, the longest tests first. Each worker takes the next test as it frees up, so a
    long test reached late would run on alone after everything else had finished: the suite's
    wall time is its busiest worker's. `@pytest.mark.slow(seconds=N)` says how long a test takes
    (a bare `slow` counts as a minute). A worker holds two tests at a time, so the longest test's
    companion is a short one and the next longest starts on the other worker at once."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def seconds(item) -> float:
        mark = item.get_closest_marker("slow")
        return 0.0 if mark is None else float(mark.kwargs.get("seconds", 60))

    items.sort(key=seconds, reverse=True)  # stable: the rest keep their order
    short = next((i for i, item in enumerate(items) if not seconds(item)), None)
    if short is not None and short > 1:
        items.insert(1, items.pop(short))


@pytest.fixture(scope="session", autouse=True)
def _quiet():
    from evotrainer.cli.main import quiet_libraries

    quiet_libraries()


@pytest.fixture(scope="session", autouse=True)
def _tmp_keeps_its_mode():
    """No test, and no sandbox a test starts, may change the mode of the shared /tmp (a sandbox
    clean-up once made it 0700 and locked the PostgreSQL tests' server user out of it)."""
    before = os.stat("/tmp").st_mode
    yield
    after = os.stat("/tmp").st_mode
    assert after == before, f"/tmp changed mode during the tests: {oct(before)} -> {oct(after)}"


@pytest.fixture
def artifacts_dir() -> Path:
    path = Path(os.environ.get("EVOTRAINER_TEST_ARTIFACTS", "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def isolated_swe_cache(tmp_path_factory):
    """Buggy task states (tasks.repos.buggy_task) are built under a temp folder, not the user's cache."""
    old = os.environ.get("EVOTRAINER_SWE_CACHE")
    os.environ["EVOTRAINER_SWE_CACHE"] = str(tmp_path_factory.mktemp("swe-cache"))
    yield
    if old is None:
        os.environ.pop("EVOTRAINER_SWE_CACHE", None)
    else:
        os.environ["EVOTRAINER_SWE_CACHE"] = old
