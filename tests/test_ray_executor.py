"""The "ray" executor for real: a private Ray instance (2 CPUs) grades SWE patches, runs the
sandbox with its limits inside Ray workers, and runs backtest chunks on Ray actors, with the
same results and the same harness-fault handling as the local process pool."""

from __future__ import annotations

import os
import sys

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'evotrainer[ray]')")

from test_backtest import LENGTH_BONUS, base_sources, gate_groups  # noqa: E402
from test_grader_redteam import CALC, FIXED, calc_patch, task  # noqa: E402,F401  (task: a fixture)

from evotrainer.backtest import Selector, run_backtest  # noqa: E402
from evotrainer.backtest.engine import HarnessVersion  # noqa: E402
from evotrainer.config import GateConfig  # noqa: E402
from evotrainer.grade.batch import grade_job as _grade_job  # noqa: E402
from evotrainer.harness.sandbox import CandidateFailure  # noqa: E402
from evotrainer.sandbox import get_executor, isolation_support, run_sandboxed  # noqa: E402
from evotrainer.sandbox.ray_executor import RayExecutor, cluster_cpus, ensure_ray  # noqa: E402
from evotrainer.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

# The probe below is defined here; Ray workers get it by value, not by importing this file.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

LIMITS = "import os, resource; print([resource.getrlimit(getattr(resource, n))[0] for n in " \
         "('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_CORE')], os.getpgid(0) == os.getsid(0))"
HANG = "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    if ray.is_initialized():
        ray.shutdown()
    ensure_ray(num_cpus=2)
    assert cluster_cpus() == 2
    yield
    ray.shutdown()


def _sandbox_probe(_: int) -> dict:
    """In a Ray worker: what the sandbox gives a command, and whether a hang is killed on time."""
    from evotrainer.sandbox.run import MIN_SANDBOX_UID, _proc_stats

    limits = run_sandboxed([sys.executable, "-c", LIMITS], timeout_s=20, cpu_s=7, mem_mb=700, nproc=9)
    hung = run_sandboxed([sys.executable, "-c", HANG], timeout_s=1.5)
    uid = hung.isolation.get("uid")
    left = [s.pid for s in _proc_stats() if uid and uid >= MIN_SANDBOX_UID and s.st_uid == uid]
    return {"pid": os.getpid(), "support": isolation_support(), "limits": limits.stdout.strip(),
            "limits_iso": {k: v for k, v in limits.isolation.items() if k not in ("uid", "child")},
            "hung": (hung.timed_out, hung.killed, hung.duration_s), "leftovers": left}


def test_sandbox_limits_and_kills_apply_inside_ray_workers():
    here = run_sandboxed([sys.executable, "-c", LIMITS], timeout_s=20, cpu_s=7, mem_mb=700, nproc=9)
    with get_executor("ray", workers=2) as ex:
        assert isinstance(ex, RayExecutor)
        probes = list(ex.map(_sandbox_probe, [0, 1]))
    for p in probes:
        assert p["pid"] != os.getpid()  # it ran in a Ray worker process
        assert p["support"] == isolation_support()  # same namespaces, cgroup, uid drop as here
        assert p["limits"] == here.stdout.strip()  # same rlimits, own session
        assert p["limits_iso"] == {k: v for k, v in here.isolation.items() if k not in ("uid", "child")}
        timed_out, killed, duration = p["hung"]
        assert timed_out and killed and duration < 10  # the whole process group went, on time
        assert p["leftovers"] == []


def test_grading_on_ray_matches_local_in_order(task):  # noqa: F811
    wrong = calc_patch(CALC.replace("return a - b", "return a * b", 1))
    patches = [task.patch, wrong, "", calc_patch(FIXED), "not a diff", task.patch]
    jobs = [(task, p, 30.0, None) for p in patches]
    with get_executor("ray", workers=2) as ex:
        on_ray = [(r["outcome"]["kind"], r["outcome"]["success"], r["outcome"]["score"]) for r in ex.map(_grade_job, jobs)]
    with get_executor("local", workers=1) as ex:
        local = [(r["outcome"]["kind"], r["outcome"]["success"], r["outcome"]["score"]) for r in ex.map(_grade_job, jobs)]
    assert on_ray == local
    assert [ok for _, ok, _ in on_ray] == [True, False, False, True, False, True]


def test_harness_faults_on_ray_are_candidate_failures(tmp_path):
    """A hang in harness code is killed by the per-call budget inside the Ray actor, and comes
    back as the candidate's failure, as with the local pool (the next test reuses the cluster)."""
    seed = base_sources()
    hang = seed["reward.py"].replace('"correct":', "**{k: 0.0 for k in iter(int, 1)},\n        \"correct\":", 1)
    with Store.open(tmp_path) as store:
        store.add_rollouts(gate_groups())
        out = run_backtest(store, HarnessVersion("seed", seed), HarnessVersion("bad", {**seed, "reward.py": hang}),
                           Selector(), GateConfig(call_timeout_s=1.0), workers=2, executor="ray")
    assert out.metrics is None and isinstance(out.failure, CandidateFailure)
    assert out.failure.harness == "candidate" and "did not return within 1 s" in out.failure.reason, out.failure.reason


def test_backtest_chunks_on_ray_actors_match_local(tmp_path):
    seed = base_sources()
    with Store.open(tmp_path) as store:
        rows = gate_groups()
        store.add_rollouts(rows[::2] + rows[1::2])  # scattered groups: chunk borders are exercised
        cand = HarnessVersion("length", {**seed, "reward.py": LENGTH_BONUS})
        local = run_backtest(store, HarnessVersion("seed", seed), cand, Selector(), workers=1)
        remote = run_backtest(store, HarnessVersion("seed", seed), cand, Selector(), workers=2,
                              chunk_size=3, executor="ray")
    assert local.failure is None and remote.failure is None
    assert remote.workers == 2
    assert remote.metrics == local.metrics
    assert remote.selection.ids_sha256 == local.selection.ids_sha256
    assert remote.metrics["candidate"]["ordering_violations"] == 1.0
