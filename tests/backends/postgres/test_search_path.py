"""The schema a store resolves at open is the one every statement names, for good.

With the default ``search_path`` (``"$user", public``) a schema named after the
role may appear later; before, the next statement of a running store (and the
next store opened) resolved the tables there: queued jobs stranded, workers
idle, no error (issue 26 item 7).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

import jaren_jobs
from tests.backends.postgres.test_server_settings import as_user
from tests.harness import PostgresUrl, with_search_path

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")
from psycopg import sql as pgsql  # noqa: E402


def _tables_in(pg: PostgresUrl, schema: str) -> list[str]:
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        ).fetchall()
    return [name for (name,) in rows]


@pytest.fixture
def role(pg: PostgresUrl) -> Iterator[str]:
    """A login role of the test's own whose search_path is ``"$user", <the test schema>``."""
    name = f"jr_{secrets.token_hex(5)}"
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN SUPERUSER')
        admin.execute(f'ALTER ROLE "{name}" SET search_path = "$user", "{pg.schema}"')
    yield name
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.execute(f'DROP OWNED BY "{name}" CASCADE')
        admin.execute(f'DROP ROLE "{name}"')


def test_a_schema_named_after_the_role_appearing_later_moves_no_store(
    pg: PostgresUrl, role: str
) -> None:
    url = as_user(pg.server_url, role)
    with jaren_jobs.open_store(url) as running:
        assert _tables_in(pg, pg.schema)  # created where "$user" did not exist yet
        running.jobs.enqueue("k", id="queued")
        # the DBA (or a migration tool) creates the role's own schema
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{role}" AUTHORIZATION "{role}"')
        # the running store, on connections old and new, keeps its tables
        running.jobs.enqueue("k", id="after")
        assert running.jobs.counts().pending == 2
        claimed = running.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.id == "queued"
        assert running.jobs.complete(claimed.lease)
        with jaren_jobs.open_store(url) as fresh:
            # a store opened now finds the queue where it is, and creates nothing
            assert fresh.jobs.counts().pending == 1
            assert fresh.jobs.get("queued").state == "done"  # type: ignore[union-attr]
    assert _tables_in(pg, role) == []


def test_a_search_path_changed_on_the_applications_connection_moves_no_store(
    pg: PostgresUrl,
) -> None:
    other = f"jo_{secrets.token_hex(5)}"
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{other}"')
    try:
        with psycopg.connect(pg.url, autocommit=True) as app:
            store = jaren_jobs.open_store(connection=app)
            store.jobs.enqueue("k", id="before")
            app.execute(f'SET search_path = "{other}"')  # the application's own choice
            store.jobs.enqueue("k", id="after")
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id="in-tx")
            assert {job.id for job in store.jobs.page()} == {"before", "after", "in-tx"}
            claimed = store.jobs.claim_many(["k"], owner="w", limit=3)
            assert len(claimed) == 3
            assert all(store.jobs.complete(c.lease) for c in claimed)
            assert store.jobs.counts().done == 3
            store.close()
        assert _tables_in(pg, other) == []
    finally:
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{other}" CASCADE')


@pytest.mark.parametrize("name", ['Odd "Quoted" Schema', "MixedCase", "tenant-1.eu"])
def test_schema_names_that_need_quoting_are_named_correctly(pg: PostgresUrl, name: str) -> None:
    schema = f"{name} {secrets.token_hex(3)}"
    ident = pgsql.Identifier(schema)
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE SCHEMA {}").format(ident))
    try:
        with psycopg.connect(pg.server_url, autocommit=True) as app:
            app.execute(pgsql.SQL("SET search_path = {}").format(ident))
            with jaren_jobs.open_store(connection=app) as store:
                store.jobs.enqueue("k", id="one")
                claimed = store.jobs.claim(["k"], owner="w")
                assert claimed is not None
                assert store.jobs.fail(claimed.lease, RuntimeError("boom"), retry=False)
                assert [e.attempt for e in store.jobs.errors("one")] == [1]
                assert store.jobs.counts().dead == 1
        assert "_jaren_jobs" in _tables_in(pg, schema)
    finally:
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            admin.execute(pgsql.SQL("DROP SCHEMA {} CASCADE").format(ident))


def test_a_url_store_keeps_its_schema_when_its_search_path_lists_several(
    pg: PostgresUrl,
) -> None:
    # tables in the second schema of the path: found there, not created in the first
    with jaren_jobs.open_store(pg.url) as first:
        first.jobs.enqueue("k", id="home")
    empty = f"je_{secrets.token_hex(5)}"
    with psycopg.connect(pg.server_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{empty}"')
    try:
        url = with_search_path(pg.server_url, f"{empty},{pg.schema}")
        with jaren_jobs.open_store(url) as store:
            assert store.jobs.get("home") is not None
        assert _tables_in(pg, empty) == []
    finally:
        with psycopg.connect(pg.server_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{empty}" CASCADE')
