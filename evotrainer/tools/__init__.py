"""The tool surface over a workspace: read, analyse and act tools that every outer agent shares.

    from evotrainer.tools import Toolbox
    with Toolbox(workdir, run, round_index, max_calls=40, max_submissions=1) as tools:
        result = tools.call("list_rollouts", {"success": False})

surface.py holds the Toolbox (budget, argument checks, transcript), registry.py the tool table
and its JSON schemas, read.py and act.py the tools, transcript.py the per-round JSON-lines log.
"""

from evotrainer.tools.act import done_path, read_done, read_submissions, submissions_path
from evotrainer.tools.registry import ERROR_KINDS, TOOLS, Tool, ToolError
from evotrainer.tools.surface import Toolbox
from evotrainer.tools.transcript import Transcript, transcript_path

__all__ = ["ERROR_KINDS", "TOOLS", "Tool", "ToolError", "Toolbox", "Transcript", "done_path", "read_done",
           "read_submissions", "submissions_path", "transcript_path"]
