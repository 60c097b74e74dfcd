"""A throwaway PostgreSQL server for the tests: initdb in a temporary directory, start, stop.

``.ci/run`` starts one before the suite and stops it in a trap; a local
``python -m pytest`` without ``JAREN_JOBS_TEST_POSTGRES_URL`` starts one
for the session itself (tests/conftest.py) when PostgreSQL is installed, so
the README's one test command covers PostgreSQL too. Tests that stop and
restart a server (faults) start a private one of their own with
:func:`start` rather than disturb the shared one.

``initdb`` and ``pg_ctl`` refuse to run as root: as root they run as the
``postgres`` user (``runuser -u postgres``), which owns the directory.
``fsync`` stays on: the durability tests depend on it.

Command line (for .ci/run)::

    python tests/postgres_server.py start DIR   # prints the URL
    python tests/postgres_server.py stop DIR
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresServer", "ServerUnavailable", "bin_dir", "start"]

HOW_TO = (
    "PostgreSQL tests need a server: install PostgreSQL (its initdb and pg_ctl), or point "
    "JAREN_JOBS_TEST_POSTGRES_URL at a server whose user may create schemas, e.g. "
    "JAREN_JOBS_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/postgres"
)


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (the message says why and what to do)."""


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""

    def version(initdb: str) -> int:
        name = Path(initdb).parent.parent.name
        return int(name) if name.isdigit() else 0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_owner(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    """One server: its data directory, port and the tools that run it."""

    root: Path
    port: int
    bin: Path
    host: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), *args]),
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.host} "
            "-c max_connections=300 -c shared_buffers=64MB"
        )
        self.pg_ctl("-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "-t", "60", "stop", check=False)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start(
    root: Path | None = None, *, port: int | None = None, host: str = "127.0.0.1"
) -> PostgresServer:
    """initdb a fresh cluster under ``root`` (a new temporary directory if None) and start it."""
    tools = bin_dir()
    if tools is None:
        raise ServerUnavailable(HOW_TO)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        raise ServerUnavailable("running as root needs runuser to start PostgreSQL; " + HOW_TO)
    root = Path(tempfile.mkdtemp(prefix="jaren-pg-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        os.chmod(root, 0o700)
    server = PostgresServer(root=root, port=port or free_port(), bin=tools, host=host)
    try:
        subprocess.run(
            _as_owner(
                [
                    str(tools / "initdb"),
                    "-D",
                    str(server.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",  # initdb's own files only; the server keeps fsync on
                ]
            ),
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        server.start()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        shutil.rmtree(root, ignore_errors=True)
        raise ServerUnavailable(f"could not start PostgreSQL: {detail.strip()}; {HOW_TO}") from exc
    return server


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: postgres_server.py start|stop DIR", file=sys.stderr)
        return 2
    root = Path(argv[1])
    if argv[0] == "start":
        print(start(root).url)
        return 0
    tools = bin_dir()
    if tools is not None and (root / "data").exists():
        PostgresServer(root=root, port=0, bin=tools).stop("fast")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
