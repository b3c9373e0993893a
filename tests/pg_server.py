"""A throwaway PostgreSQL server on loopback for tests: initdb + pg_ctl in a temp folder.

    server = PostgresServer.start()        # or the `postgres` pytest fixture below
    url = server.new_database("t1")        # postgresql+psycopg://evo@127.0.0.1:PORT/t1
    server.stop()

Uses the Debian server packages (`apt-get install postgresql`: /usr/lib/postgresql/<v>/bin) or
$EVOTRAINER_PG_BINDIR. initdb refuses to run as root, so as root the cluster runs as the
`postgres` user those packages create. Trust auth is safe here: the server listens on 127.0.0.1
only, on a free port, its socket sits in the temp folder, and it lives for the test session.
Without binaries (or psycopg) the fixture skips with the reason, unless
EVOTRAINER_REQUIRE_POSTGRES=1 (CI) turns that into a failure.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

USER = "evo"


def find_bindir() -> Path | None:
    candidates = [os.environ.get("EVOTRAINER_PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb")).parent))
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def missing_reason() -> str | None:
    """Why no server can be started here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'evotrainer[postgres]')"
    if find_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run initdb as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: Path, root: Path, port: int):
        self.bindir, self.root, self.port = bindir, root, port
        self.data = root / "data"

    @classmethod
    def start(cls) -> PostgresServer:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(missing_reason())
        root = Path(tempfile.mkdtemp(prefix="evo-pg-"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(root, pw.pw_uid, pw.pw_gid)
        server = cls(bindir, root, _free_port())
        try:
            server._run("initdb", "-D", str(server.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                        "--locale=C", "--no-sync")
            for _attempt in range(3):  # the free port can be taken between the probe and the bind
                opts = (f"-c listen_addresses=127.0.0.1 -p {server.port} -c unix_socket_directories={root} "
                        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
                done = server._run("pg_ctl", "-D", str(server.data), "-o", opts, "-l", str(root / "server.log"),
                                   "-w", "-t", "60", "start", check=False)
                if done.returncode == 0:
                    return server
                server.port = _free_port()
            log = (root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {done.stderr}\n{log}")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        return done

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        finally:
            deadline = time.monotonic() + 10
            while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("EVOTRAINER_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"EVOTRAINER_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


_counter = iter(range(1_000_000))


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh database on the session's server, one per test."""
    return postgres.new_database(f"t{os.getpid()}_{next(_counter)}")
