"""State files written by several processes at once (the ranks of a launch) stay whole."""

import json
import os
import subprocess
import sys
from pathlib import Path

from evotrainer.jsonfile import write_json

WRITER = """
import sys
from evotrainer.jsonfile import write_json
for i in range(400):
    write_json(sys.argv[1], {"writer": sys.argv[2], "i": i, "pad": "x" * 4000})
"""


def test_two_processes_writing_one_file_at_once_both_finish_and_leave_it_whole(tmp_path):
    target = tmp_path / "state.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), name], stderr=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors  # a shared temp name made one rename fail
    data = json.loads(target.read_text())
    assert data["i"] == 399 and data["writer"] in ("a", "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file is left behind


def test_the_file_gets_the_mode_a_plain_write_gives(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    write_json(tmp_path / "state.json", {"a": 1})
    assert os.stat(tmp_path / "state.json").st_mode == os.stat(plain).st_mode


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "state.json"
    write_json(target, {"a": 1})
    try:
        write_json(target, {"a": object()})
    except TypeError:
        pass
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in Path(tmp_path).iterdir()] == ["state.json"]
