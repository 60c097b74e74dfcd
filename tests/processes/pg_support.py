"""PostgreSQL for the process tests: a schema per test, and private servers to crash.

* :func:`pg_schema` (a fixture): a fresh schema on the server named by
  ``JAREN_JOBS_TEST_POSTGRES_URL``, dropped afterwards; the test gets a URL
  whose ``search_path`` is that schema, so nothing it does is seen by anyone
  else on the server (other engineers, other tests).
* :class:`PrivateServer` / :func:`private_pg`: a server of the test's own
  (``initdb`` in a temporary directory, ``pg_ctl`` on a free port, fsync on),
  for tests that stop the server or change how it listens. The shared server
  is never stopped or reconfigured.

The server is the suite's (:func:`tests.conftest.require_postgres`): the
one named by the variable, or one started for the session when PostgreSQL is
installed; without either a test skips, and in CI (``$CI`` set) it fails.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

URL_VARIABLE = "JAREN_JOBS_TEST_POSTGRES_URL"
PG_BIN = Path(os.environ.get("JAREN_JOBS_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def base_url() -> str:
    """The shared server's URL: skips without one, and fails in CI (as every PostgreSQL test)."""
    from tests.conftest import require_postgres

    return require_postgres()


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>`` added (kept with any other query)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def connect(url: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, **kwargs)


@dataclass
class Schema:
    """One test's schema: ``url`` opens the library (and raw connections) inside it."""

    base: str
    name: str

    @property
    def url(self) -> str:
        return with_search_path(self.base, self.name)

    def connect(self) -> Any:
        return connect(self.url)

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            return list(conn.execute(sql, params).fetchall())

    def execute(self, sql: str, params: Any = ()) -> None:
        with self.connect() as conn:
            conn.execute(sql, params)


@contextlib.contextmanager
def schema_on(base: str, *, long: bool = False) -> Iterator[Schema]:
    name = f"pgproc_{uuid.uuid4().hex[:12]}"
    if long:  # a tenant-style name: "jaren_jobs.<schema>" no longer fits a channel's 63 bytes
        name = f"{name}_tenant_with_a_long_and_descriptive_name"
    with connect(base) as admin:
        admin.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield Schema(base, name)
    finally:
        with connect(base) as admin:
            # end any session a killed worker left behind, or the drop would wait on it
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND query LIKE %s",
                (f"%{name}%",),
            )
            # a session still holding a lock in it fails the teardown, never hangs it
            admin.execute("SET lock_timeout = '30s'")
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def pg_schema() -> Iterator[Schema]:
    with schema_on(base_url()) as schema:
        yield schema


@pytest.fixture(params=["short", "long"])
def pg_schema_any_length(request: pytest.FixtureRequest) -> Iterator[Schema]:
    """A schema whose name fits a channel name, and one that does not (56+ bytes)."""
    with schema_on(base_url(), long=request.param == "long") as schema:
        assert (len(schema.name.encode()) >= 56) == (request.param == "long")
        yield schema


# ------------------------------------------------------------------ private servers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_postgres(command: list[str]) -> list[str]:
    # initdb and pg_ctl refuse to run as root
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


class PrivateServer:
    """A PostgreSQL server of one test's own, started with ``pg_ctl`` and stopped at the end."""

    def __init__(self, listen: str = "127.0.0.1") -> None:
        if not (PG_BIN / "initdb").exists():
            pytest.skip(f"no PostgreSQL binaries in {PG_BIN} (set JAREN_JOBS_TEST_PG_BIN)")
        pytest.importorskip("psycopg", reason="pip install 'jaren_jobs[postgres]'")
        # not tmp_path: pytest makes its parents 0700 root, which the postgres user
        # cannot traverse; a directory of our own that we chown and remove
        self.root = Path(tempfile.mkdtemp(prefix="jaren-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.listen = listen
        self.log = self.root / "server.log"
        if os.geteuid() == 0:
            ids = pwd.getpwnam("postgres")
            os.chown(self.root, ids.pw_uid, ids.pw_gid)
        subprocess.run(
            _as_postgres(
                [str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]
            ),
            check=True,
            capture_output=True,
        )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")  # the netns test's other hosts
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '{listen}'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 200\n"
                "fsync = on\nsynchronous_commit = on\n"
            )

    def url(self, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(
            _as_postgres(
                [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), *args]
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        self._pg_ctl("-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-w", "-t", "30", "-m", mode, "stop")

    def running(self) -> bool:
        done = subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "status"]),
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivateServer]:
    base_url()  # the same skips as every PostgreSQL test
    server = PrivateServer()
    try:
        server.start()
        with connect(server.url()) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
        yield server
    finally:
        server.destroy()


# ------------------------------------------------------------------ network namespaces


def netns_unavailable() -> str | None:
    """Why this machine cannot simulate other hosts with ``ip netns`` (None when it can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on this machine"
    name = f"jjprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return (
            "creating a network namespace needs CAP_SYS_ADMIN, which this machine does not "
            f"grant: {made.stderr.strip()}"
        )
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    return None


@dataclass
class Host:
    """A simulated host: a network namespace joined to ours by a veth pair."""

    namespace: str
    address: str  # this host's address
    gateway: str  # our end of the pair: where the server listens for it

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]


@contextlib.contextmanager
def simulated_hosts(count: int) -> Iterator[list[Host]]:
    tag = uuid.uuid4().hex[:6]
    hosts: list[Host] = []
    made: list[tuple[str, str]] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        for n in range(count):
            namespace, ours, theirs = f"jj{tag}{n}", f"jjh{tag}{n}", f"jjn{tag}{n}"
            subnet = f"10.{200 + n}.{int(tag[:2], 16)}"
            ip("netns", "add", namespace)
            made.append((namespace, ours))
            ip("link", "add", ours, "type", "veth", "peer", "name", theirs)
            ip("link", "set", theirs, "netns", namespace)
            ip("addr", "add", f"{subnet}.1/30", "dev", ours)
            ip("link", "set", ours, "up")
            ip("netns", "exec", namespace, "ip", "addr", "add", f"{subnet}.2/30", "dev", theirs)
            ip("netns", "exec", namespace, "ip", "link", "set", theirs, "up")
            ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
            hosts.append(Host(namespace, f"{subnet}.2", f"{subnet}.1"))
        yield hosts
    finally:
        for namespace, ours in made:
            subprocess.run(["ip", "link", "del", ours], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
