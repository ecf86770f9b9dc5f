"""A real PostgreSQL server for the tests (billing, stored responses, the chart's
URL) and the soak: initdb into a temporary folder, then `postgres` on a free loopback port.

PostgreSQL refuses to run as root; run as root (CI's Debian containers, this
machine), the server runs as the `postgres` user that Debian's package
creates, in a folder it owns. `.ci/run` installs the package when initdb is
missing; MAAS_REQUIRE_POSTGRES=1 (set by .ci/run) turns a server that cannot
start into a failure instead of a skip.
"""

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from maas_tools.local.ports import free_port

REQUIRED = os.environ.get("MAAS_REQUIRE_POSTGRES") == "1"


class PostgresUnavailable(RuntimeError):
    pass


def bindir() -> Path:
    """Where initdb and postgres are: pg_config's bindir, Debian's versioned folder, or PATH."""
    candidates = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb")).resolve().parent))
    for folder in candidates:
        if folder and (Path(folder) / "initdb").exists() and (Path(folder) / "postgres").exists():
            return Path(folder)
    raise PostgresUnavailable("no PostgreSQL binaries (initdb, postgres) found")


class PostgresServer:
    def __init__(self, port: int | None = None, fsync: bool = False):
        self.port = port or free_port()
        self.fsync = fsync
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="maas-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.process: subprocess.Popen | None = None
        self._user = None
        if os.geteuid() == 0:
            try:
                shutil.chown(self.root, "postgres", "postgres")
            except LookupError as exc:
                raise PostgresUnavailable("running as root and no postgres user") from exc
            self._user = "postgres"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, user=self._user, cwd=self.root)

    def start(self, timeout: float = 60) -> None:
        if not self.data.exists():
            done = self._run(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-sync",
            )  # fmt: skip
            if done.returncode:
                raise PostgresUnavailable(f"initdb failed: {done.stderr.strip()}")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                    "-k", str(self.root), "-c", "listen_addresses=127.0.0.1",
                    "-c", f"fsync={'on' if self.fsync else 'off'}",
                    "-c", "max_connections=200",
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                user=self._user, cwd=self.root,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            ready = self._run(str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port))
            if ready.returncode == 0:
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise PostgresUnavailable(f"postgres did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def create_database(self, name: str) -> str:
        done = self._run(
            str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
            name,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"createdb {name}: {done.stderr.strip()}")
        return self.url(name)

    def cpu_seconds(self) -> float:
        """User and system CPU of the server and its backends so far (benchmarks)."""
        server = psutil.Process(self.process.pid)
        total = 0.0
        for process in [server, *server.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def kill(self) -> None:
        """kill -9 of the postmaster, as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def running_postgres():
    """A started server for a pytest fixture to `yield from`, removed afterwards;
    the test is skipped where none can start, and failed under MAAS_REQUIRE_POSTGRES=1."""
    import pytest

    try:
        server = PostgresServer()
        server.start()
    except PostgresUnavailable as exc:
        if REQUIRED:
            pytest.fail(f"PostgreSQL is required (MAAS_REQUIRE_POSTGRES=1): {exc}")
        pytest.skip(f"no PostgreSQL here: {exc}")
    yield server
    server.remove()
