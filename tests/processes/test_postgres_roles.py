"""The least-privilege roles of docs/postgres.md, applied exactly as the page prints them.

Roles are cluster-wide, so this runs on a private server, never the shared
one. The SQL is read from the page itself: if the GRANTs there stop being
enough (a new table, a sequence, a new statement), this fails and the page
must change with the library.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from jaren_jobs import NewJob, SchemaError, open_store
from tests.processes.pg_support import PrivateServer, connect

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "postgres.md"
AFTER_OWNER = "-- after jobs_owner has opened a store once"


def role_sql() -> tuple[str, str]:
    """The page's roles block, split where the owner must first open a store."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Roles and least privilege") :]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block is not None, "docs/postgres.md lost its roles block"
    before, after = block.group(1).split(AFTER_OWNER)
    return before, after.split("\n", 1)[1]


@pytest.mark.slow
def test_the_documented_grants_are_enough_for_the_application_role(
    private_pg: PrivateServer,
) -> None:
    before, after = role_sql()
    with connect(private_pg.url()) as admin:
        admin.execute(before)
    owner_url = private_pg.url().replace("postgres@", "jobs_owner@")
    app_url = private_pg.url().replace("postgres@", "app@")

    # the application role cannot create the tables itself: SPEC §4's SchemaError (the
    # tables could not be created), the server's refusal as its cause, nothing created
    with pytest.raises(SchemaError) as refused, open_store(app_url):
        pass
    assert isinstance(refused.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert refused.value.details["found"] == 0
    assert "schema's owner" in str(refused.value)
    with open_store(owner_url):
        pass  # the deploy step: the owner creates the tables
    with connect(private_pg.url()) as admin:
        admin.execute(after)

    with open_store(app_url) as store:
        store.jobs.enqueue("k", {"n": 0}, id="one")
        store.jobs.enqueue_many([NewJob("k", {"n": i}) for i in range(1, 4)])
        claimed = store.jobs.claim(["k"], owner="app", lease_seconds=30)
        assert claimed is not None
        checkpoints = store.jobs.checkpoints_for(claimed)
        checkpoints.save(claimed.id, "node", {"v": 1})
        assert checkpoints.load(claimed.id) == {"node": {"v": 1}}
        lease = store.jobs.renew(claimed.lease)
        assert store.jobs.complete(lease, {"ok": True})
        second = store.jobs.claim(["k"], owner="app")
        assert second is not None
        assert store.jobs.fail(second.lease, RuntimeError("no"), retry=False)
        assert store.jobs.requeue(second.id)
        third = store.jobs.claim(["k"], owner="app")
        assert third is not None
        assert store.jobs.cancel(third.id, lease=third.lease)
        with store.transaction() as tx:
            tx.jobs.enqueue("k", {"in": "tx"}, id="in-tx")
        future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
        assert store.jobs.sweep(settled_before=future) >= 2
        counts = store.jobs.counts()
        assert counts.done == 0
        assert counts.cancelled == 0
        assert len(list(store.jobs.page())) >= 2

    with open_store(app_url, readonly=True) as reader:
        assert reader.jobs.get("in-tx") is not None

    with connect(private_pg.url()) as admin:
        # the application role created nothing of its own
        owned = admin.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
            "WHERE r.rolname = 'app'"
        ).fetchall()
    assert owned == []
