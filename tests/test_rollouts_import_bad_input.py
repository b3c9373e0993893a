"""Red team for `evotrainer rollouts import` and `--rollouts ids=@FILE`: one test per bad input.

Each runs the real CLI (typer's CliRunner, or real processes for the race) against a real SQLite
store, and asserts a clear `FILE:LINE: what is wrong`, no traceback, nothing stored, and none of
the file's content in the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evotrainer.cli.rollouts import app
from evotrainer.store import Store
from evotrainer.store.line_checks import MAX_DEPTH, MAX_LINE_BYTES

ENV = {"COLUMNS": "200", "EVOTRAINER_STORE_URL": None, "EVOTRAINER_WORKDIR": None}
SECRET = "hunter2-Zq8Lp4Wx"


def good(i: int = 0, **fields) -> dict:
    data = {"id": f"r{i:05d}", "task_id": f"t{i % 7}", "group_id": f"g{i // 4}", "domain": "math",
            "prompt": "What is 2 + 2?", "completion": "Answer: 4", "turns": [], "num_tokens": 5,
            "truncated": False, "outcome": {"success": True, "score": 1.0, "kind": "ok", "flags": []},
            "meta": {"level": 1}}
    data.update(fields)
    return data


@pytest.fixture
def target(tmp_path: Path) -> Path:
    workdir = tmp_path / "work"
    Store.open(workdir).close()
    return workdir


def run_import(target: Path, path: Path, *extra: str):
    res = CliRunner().invoke(app, ["import", str(path), "-w", str(target), *extra], env=ENV)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


def stored(target: Path) -> int:
    with Store.open(target) as store:
        return store.count_rollouts()


def write(tmp_path: Path, *lines: bytes | str | dict) -> Path:
    """A JSONL file: one good line first (so 'nothing partial' is tested too), then `lines`."""
    out = [json.dumps(good(99)).encode()]
    for line in lines:
        out.append(json.dumps(line).encode() if isinstance(line, dict)
                   else line.encode("utf-8") if isinstance(line, str) else line)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def assert_rejected(target: Path, path: Path, expected: str, line: int = 2) -> str:
    res = run_import(target, path)
    assert res.exit_code == 2, res.output
    assert f"{path}:{line}: {expected}" in res.stderr, res.stderr
    assert "nothing imported" in res.stderr
    assert stored(target) == 0
    return res.output


def test_lone_surrogate_escape(tmp_path, target):
    line = json.dumps(good(1)).replace('"Answer: 4"', '"Answer: \\ud800"')
    assert_rejected(target, write(tmp_path, line), "field 'completion' holds a lone surrogate")


def test_lone_surrogate_in_a_meta_key(tmp_path, target):
    line = json.dumps(good(1)).replace('"level"', '"\\udfff"')
    assert_rejected(target, write(tmp_path, line), "a key holds a lone surrogate")


def test_invalid_utf8(tmp_path, target):
    line = json.dumps(good(1)).encode().replace(b"Answer: 4", b"Answer: \xff\xfe")
    assert_rejected(target, write(tmp_path, line), "not valid UTF-8")


@pytest.mark.parametrize("where", ["top", "meta", "turns"])
def test_100k_deep_nesting(tmp_path, target, where):
    deep = "[" * 100_000 + "]" * 100_000
    text = json.dumps(good(1))
    line = {"top": deep,
            "meta": text.replace('"meta": {"level": 1}', f'"meta": {{"x": {deep}}}'),
            "turns": text.replace('"turns": []', f'"turns": {deep}')}[where]
    assert_rejected(target, write(tmp_path, line), f"JSON nested deeper than {MAX_DEPTH} levels")


def test_nesting_just_past_the_cap_and_at_it(tmp_path, target):
    def nested(levels: int) -> str:  # the line is level 1, meta level 2, each {"a": ...} one more
        chain = '{"a": ' * (levels - 2) + "{}" + "}" * (levels - 2)
        return json.dumps(good(1)).replace('"meta": {"level": 1}', '"meta": ' + chain)
    assert_rejected(target, write(tmp_path, nested(MAX_DEPTH + 1)), "JSON nested deeper")
    res = run_import(target, write(tmp_path, nested(MAX_DEPTH)))
    assert res.exit_code == 0 and "imported 2" in res.stdout


@pytest.mark.parametrize("field, value, message", [
    ("num_tokens", 10**30, "field 'num_tokens' is out of range for the store (a 32-bit integer)"),
    ("num_tokens", 2**31, "field 'num_tokens' is out of range"),
    ("seed", 2**63, "field 'meta.train.seed' is out of range for the store (a 64-bit integer)"),
    ("step", -(2**40), "field 'meta.train.step' is out of range"),
    ("num_tokens", 5000, "invalid JSON: a number too long to read"),  # 5000 digits
], ids=["1e30", "2^31", "seed-2^63", "step--2^40", "5000-digits"])
def test_integers_that_do_not_fit_their_column(tmp_path, target, field, value, message):
    data = good(1)
    if message.endswith("too long to read"):
        value = 10 ** (value - 1)
    if field in ("seed", "step"):
        data["meta"] = {"train": {field: value}}
    else:
        data[field] = value
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # the test may write the number; the importer must refuse it
    try:
        line = json.dumps(data)
    finally:
        sys.set_int_max_str_digits(limit)
    assert_rejected(target, write(tmp_path, line), message)


@pytest.mark.parametrize("fields, message", [
    ({"id": "a\u0000b"}, "field 'id' holds a control character (such as NUL)"),
    ({"id": "a\nb"}, "field 'id' holds a control character"),
    ({"group_id": "g\u009b31m"}, "field 'group_id' holds a control character"),
    ({"id": "x" * 129}, "field 'id' is 129 characters, over the store's 128"),
    ({"task_id": "t" * 257}, "field 'task_id' is 257 characters, over the store's 256"),
    ({"domain": "d" * 65}, "field 'domain' is 65 characters, over the store's 64"),
    ({"id": "   "}, "field 'id' must not be empty"),
    ({"meta": {"train": {"model_version": "m" * 129}}}, "field 'meta.train.model_version' is 129 characters"),
])
def test_identifiers_the_columns_cannot_hold(tmp_path, target, fields, message):
    assert_rejected(target, write(tmp_path, good(1, **fields)), message)


def test_an_id_of_exactly_the_column_length_is_fine(tmp_path, target):
    res = run_import(target, write(tmp_path, good(1, id="x" * 128)))
    assert res.exit_code == 0 and stored(target) == 2


def test_a_line_over_the_cap_is_refused_and_the_next_line_still_counts(tmp_path, target):
    huge = json.dumps(good(1, completion="y" * (MAX_LINE_BYTES + 10)))
    path = write(tmp_path, huge, "{not json")
    out = assert_rejected(target, path, "the line is longer than 8 MiB")
    assert f"{path}:3: invalid JSON" in out  # line numbers stay right after the skipped line
    assert "yyyyyyyy" not in out


def test_a_line_at_the_cap_is_fine(tmp_path, target):
    line = json.dumps(good(1, completion=""))
    line = line.replace('"completion": ""', '"completion": "' + "z" * (MAX_LINE_BYTES - len(line)) + '"')
    assert len(line.encode()) == MAX_LINE_BYTES
    res = run_import(target, write(tmp_path, line))
    assert res.exit_code == 0 and stored(target) == 2


def test_no_file_content_is_echoed(tmp_path, target):
    """A credentials file given by mistake, and JSON whose bad values hold a secret."""
    path = write(tmp_path,
                 f"aws_secret_access_key = {SECRET}",
                 good(1, outcome={"success": True, "score": SECRET, "kind": "ok", "flags": []}),
                 good(2, outcome={"success": True, "score": 1.0, "kind": SECRET, "flags": []}),
                 {**good(3), SECRET: 1, "complation": 2},
                 good(4, meta={"train": {SECRET: 1}}),
                 good(5, id=SECRET + "\u0000"),
                 good(99),  # a duplicate of line 1: says which line, not which id
                 good(6, meta={"train": {"reward_components": {SECRET + " x": "high"}}}))
    res = run_import(target, path)
    assert res.exit_code == 2 and stored(target) == 0
    assert SECRET not in res.output and "r00099" not in res.output, res.output
    for line, expected in [(2, "invalid JSON"), (3, "field 'outcome': outcome score must be a finite number, got <value>"),
                           (4, "field 'outcome': outcome kind <value> is not one of"), (5, "unknown field(s): complation, <name>"),
                           (6, "unknown field(s) in 'meta.train': <name>"), (7, "field 'id' holds a control"),
                           (8, "duplicate id (first on line 1)"),
                           (9, "field 'meta.train.reward_components.<name>' must be a finite number")]:
        assert f"{path}:{line}: {expected}" in res.stderr, (line, res.stderr)


def test_importing_into_a_folder_that_does_not_exist_creates_nothing(tmp_path):
    path = write(tmp_path)
    missing = tmp_path / "no" / "such" / "workspace"
    res = run_import(missing, path)
    assert res.exit_code == 2 and "no workspace folder" in res.stderr
    assert not (tmp_path / "no").exists()


def test_the_same_id_already_stored_names_the_line_not_the_id(tmp_path, target):
    path = write(tmp_path, good(1))
    assert run_import(target, path).exit_code == 0
    res = run_import(target, path)
    assert res.exit_code == 2 and f"{path}:1: the id is already in the store" in res.stderr
    assert "r00001" not in res.output and stored(target) == 2


@pytest.mark.parametrize("fresh", [False, True])
def test_two_concurrent_imports_of_one_file_store_each_rollout_once(tmp_path, fresh):
    """Real processes: both finish without a traceback, one stores all, the other reports the
    duplicates; every rollout is stored exactly once."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    if not fresh:
        Store.open(workdir).close()
    n = 1000
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(good(i)) + "\n" for i in range(n)))
    env = {k: v for k, v in os.environ.items() if k not in ("EVOTRAINER_STORE_URL", "EVOTRAINER_WORKDIR")}
    cmd = [sys.executable, "-m", "evotrainer", "rollouts", "import", str(path), "-w", str(workdir)]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]  # the loser writes n lines: never wait() on a full pipe
    results = [(p.returncode, *out) for p, out in zip(procs, outputs)]
    for _code, out, err in results:
        assert "Traceback" not in out + err, err
    assert sorted(code for code, _, _ in results) == [0, 2], results
    [(_, winner, _)] = [r for r in results if r[0] == 0]
    [(_, _, loser)] = [r for r in results if r[0] == 2]
    assert f"imported {n} rollout(s)" in winner
    assert f"{path}:1: the id is already in the store" in loser and f"{n} bad line(s), nothing imported" in loser
    with Store.open(workdir) as store:
        ids = [sr.rollout.id for sr in store.iter_rollouts()]
    assert len(ids) == len(set(ids)) == n


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_writer_that_stores_the_same_ids_during_the_import(tmp_path):
    """Deterministic race: another writer (a trainer, another import) holds the store's write
    lock with the same ids uncommitted while the import checks them, and commits while the
    import waits for the lock. The import's insert then hits the unique id: it must say
    "already in the store", store nothing, and leave every rollout stored once."""
    import threading

    from evotrainer.store.jsonl import from_export_dict

    workdir = tmp_path / "work"
    Store.open(workdir).close()
    n = 1000  # one add_rollouts batch: the writer's rows are flushed, its lock held, while it waits
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(good(i)) + "\n" for i in range(n)))
    release, holding = threading.Event(), threading.Event()

    def rows():
        yield from (from_export_dict(good(i)) for i in range(n))
        holding.set()
        release.wait(120)

    writer_store = Store.open(workdir)
    writer = threading.Thread(target=writer_store.add_rollouts, args=(rows(),))
    writer.start()
    try:
        assert holding.wait(60)
        env = {k: v for k, v in os.environ.items() if k not in ("EVOTRAINER_STORE_URL", "EVOTRAINER_WORKDIR")}
        proc = subprocess.Popen([sys.executable, "-m", "evotrainer", "rollouts", "import", str(path), "-w", str(workdir)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Blocked on the lock = no CPU used for a while (SQLite's busy handler sleeps).
        last, still = -1, 0
        while proc.poll() is None and still < 15:
            time.sleep(0.1)
            ticks = _cpu_ticks(proc.pid)
            still = still + 1 if ticks == last else 0
            last = ticks
    finally:
        release.set()
        writer.join(60)
        writer_store.close()
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in out + err, err
    assert proc.returncode == 2, (out, err)
    assert f"{path}:1: the id is already in the store" in err and f"{n} bad line(s), nothing imported" in err
    with Store.open(workdir) as store:
        ids = [sr.rollout.id for sr in store.iter_rollouts()]
    assert len(ids) == len(set(ids)) == n


# ---------------------------------------------------------------- --rollouts ids=@FILE


def _backtest(tmp_path: Path, ids: Path):
    from test_backtest import workspace

    from evotrainer.cli.main import app as main_app

    ws = workspace(tmp_path / "bt")
    with Store.open(ws.root) as store:
        from evotrainer.store.jsonl import from_export_dict
        store.add_rollouts([from_export_dict(good(i)) for i in range(4)])
    res = CliRunner().invoke(main_app, ["backtest", "main", "--rollouts", f"ids=@{ids}", "--workdir", str(ws.root)],
                             env=ENV)
    assert "Traceback" not in res.output and not isinstance(res.exception, (KeyError, UnicodeError)), res.exception
    return res


def test_ids_file_contents_are_not_echoed(tmp_path):
    ids = tmp_path / "credentials"
    ids.write_text(f"r00001\n{SECRET}\nanother-{SECRET}\nr00002\nlast-{SECRET}\nmore-{SECRET}\n")
    res = _backtest(tmp_path, ids)
    assert res.exit_code != 0
    assert "4 of the 6 listed rollout id(s) are not in the store (list entries 2, 3, 5, ...)" in res.output, res.output
    assert SECRET not in res.output


@pytest.mark.parametrize("content, expected", [
    (b"r00001\n\xff\xfe\n", ":2: not valid UTF-8 text"),
    (b"r00001\nab\x00cd\n", ":2: holds a control character"),
    (b"# ids\n" + b"x" * 129 + b"\n", ":2: 129 characters, longer than any rollout id (128)"),
])
def test_bad_ids_file_lines_are_named_by_line(tmp_path, content, expected):
    ids = tmp_path / "ids.txt"
    ids.write_bytes(content)
    res = _backtest(tmp_path, ids)
    assert res.exit_code == 2 and f"{ids}{expected}" in res.output, res.output
    assert "abcd" not in res.output.replace(" ", "") and "xxxxxxxx" not in res.output


def test_an_ids_file_under_proc_is_read_no_further_than_needed(tmp_path):
    res = _backtest(tmp_path, Path("/proc/self/environ"))  # size 0 on disk, NUL-separated secrets
    assert res.exit_code == 2 and "/proc/self/environ:1:" in res.output, res.output
    assert os.environ.get("PATH", "-") not in res.output


def test_an_ids_file_line_without_end_is_cut_short(tmp_path):
    ids = tmp_path / "blob"
    ids.write_bytes(b"r00001\n" + SECRET.encode() * 10_000)
    res = _backtest(tmp_path, ids)
    assert res.exit_code == 2 and f"{ids}:2: over 4096 bytes" in res.output and SECRET not in res.output
