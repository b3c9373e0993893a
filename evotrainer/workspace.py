"""The workspace a run leaves behind: a git repo of harness versions, skills, backtests, store, adapters.

`ensure_workspace` is what `init`, `train` and `eval` call: it makes a missing workspace and
leaves an existing one alone. The harness repo's root *is* the harness folder, and its first
commit on `main` is the seed copied from the package (or from the config's `harness:` folder).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import git

from evotrainer.errors import UserError
from evotrainer.harness.loader import HARNESS_FILES, read_sources
from evotrainer.harness.trusted_git import GUARD_FILE, MainGuard, safe_env
from evotrainer.paths import HARNESSES_DIR
from evotrainer.sandbox.protected import protect

MAIN = "main"
IDENTITY = ("evotrainer", "evotrainer@localhost")
# The workspace's domain lives in the harness repo's own config, next to the history it governs.
DOMAIN_KEY = ("evotrainer", "domain")


class WorkspaceError(UserError):
    """A workspace that cannot be made or used; the message names the folder."""


class Workspace:
    """Paths inside one workspace folder. Cheap to build: it touches no file."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        protect(self.root)  # never visible to a policy's sandboxed code (sandbox/protected.py)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    @property
    def harnesses(self) -> Path:
        return self.root / "harnesses"

    @property
    def skills(self) -> Path:
        return self.root / "skills"

    @property
    def backtests(self) -> Path:
        return self.root / "backtests"

    @property
    def adapters(self) -> Path:
        return self.root / "adapters"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def store_path(self) -> Path:
        return self.root / "store.db"

    def exists(self) -> bool:
        return (self.harnesses / ".git").is_dir()

    @property
    def domain(self) -> str | None:
        """The domain the harness repo was seeded for (None when there is no repo or no record)."""
        if not self.exists():
            return None
        with git.Repo(self.harnesses).config_reader("repository") as config:
            return config.get_value(*DOMAIN_KEY, default=None)


def seed_files(seed: Path) -> dict[str, bytes]:
    """The files a seed folder contributes: the harness files plus extra root-level
    .py/.yaml/.j2/.md files; nothing nested, nothing hidden."""
    read_sources(seed)  # HarnessError naming the first missing harness file
    files = {}
    for path in sorted(seed.iterdir()):
        extra = path.suffix in (".py", ".yaml", ".j2", ".md") and not path.name.startswith((".", "_"))
        if path.is_file() and not path.is_symlink() and (path.name in HARNESS_FILES or extra):
            files[path.name] = path.read_bytes()
    return files


def ensure_workspace(root: Path | str, domain: str, seed: Path | str | None = None) -> Workspace:
    """Make the workspace at `root` if it is missing; return it.

    `seed` is the harness folder the repo starts from (default: the package's harnesses/<domain>);
    it only matters when the repo is created. An existing workspace for `domain` is left as it is;
    one for another domain is a WorkspaceError.
    """
    ws = Workspace(root)
    if ws.exists():
        found = ws.domain
        if found is None:
            raise WorkspaceError(
                f"{ws.harnesses}: a git repo that does not record its domain; if it is a harness repo, "
                f"run `git -C {ws.harnesses} config {'.'.join(DOMAIN_KEY)} {domain}`")
        if found != domain:
            raise WorkspaceError(
                f"{ws.root}: workspace is for domain {found!r}, not {domain!r}; "
                "use another --workdir for this domain")
    else:
        if ws.harnesses.exists() and any(ws.harnesses.iterdir()):
            raise WorkspaceError(f"{ws.harnesses}: exists, is not empty and is not a git repo; "
                                 "move it away or pick another --workdir")
        if seed is None:
            from evotrainer.domains import resolve  # the domain names its own seed harness

            seed = resolve(domain).seed_harness()
        seed = Path(seed)
        if not seed.is_dir():
            shipped = sorted(p.name for p in HARNESSES_DIR.iterdir() if p.is_dir()) if HARNESSES_DIR.is_dir() else []
            raise WorkspaceError(f"no seed harness for domain {domain!r} at {seed} "
                                 f"(shipped domains: {', '.join(shipped) or 'none'})")
        _create_harness_repo(ws, domain, seed)
    for folder in (ws.skills, ws.backtests):
        folder.mkdir(parents=True, exist_ok=True)
    return ws


def _create_harness_repo(ws: Workspace, domain: str, seed: Path) -> None:
    # Built beside its final place and renamed in, so a crash never leaves a half-made repo
    # that the next call would take for a workspace.
    files = seed_files(seed)
    ws.root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".harnesses-", dir=ws.root))
    try:
        repo = git.Repo.init(staging, initial_branch=MAIN)
        repo.git.update_environment(**safe_env())  # the user's global hooks do not run on our seed
        with repo.config_writer("repository") as config:
            config.set_value("user", "name", IDENTITY[0])
            config.set_value("user", "email", IDENTITY[1])
            config.set_value(*DOMAIN_KEY, domain)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        repo.git.add("--", *files)
        message = (f"Seed harness for {domain}\n\n"
                   f"The starting harness, copied from {seed.resolve()}.\n"
                   "Every later change is a candidate branch merged into main.\n")
        repo.git.commit("--quiet", "--no-verify", "-m", message)
        seed_sha = repo.head.commit.hexsha
        repo.close()
        if ws.harnesses.exists():  # an empty folder (checked above)
            ws.harnesses.rmdir()
        staging.rename(ws.harnesses)
        # The creator records main's tip: a guard left by an older repo here would otherwise
        # refuse this one, and ranks opening the new repo at once find it recorded.
        MainGuard(ws.root / GUARD_FILE).record(seed_sha)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
