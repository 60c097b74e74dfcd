"""The connections a URL store opens: bounded waits on a dead or half-open server.

``connect_timeout`` bounds a connect; TCP keepalives notice an idle
connection whose peer vanished; ``tcp_user_timeout`` bounds how long data
sent to a vanished peer may stay unacknowledged (keepalives are not sent
while it is, so without it a statement sent into a half-open connection
waits out the kernel's retransmissions, about fifteen minutes). Each is a
default the URL may override: a setting the URL names is the one used.
"""

from __future__ import annotations

import pytest

from jaren_jobs import Store, open_store
from tests.harness import PostgresUrl

psycopg = pytest.importorskip("psycopg", reason="the dev extra installs psycopg")


def _settings(store: Store) -> dict[str, str | None]:
    conn = store._backend.db.connection  # type: ignore[attr-defined]
    return {
        option.keyword.decode(): None if option.val is None else option.val.decode()
        for option in conn.pgconn.info
    }


def test_a_url_store_bounds_connects_idle_peers_and_unacknowledged_sends(pg: PostgresUrl) -> None:
    settings = _settings(pg.open())
    assert settings["connect_timeout"] == "10"
    assert settings["keepalives"] == "1"
    assert int(settings["keepalives_idle"] or 0) > 0
    assert int(settings["tcp_user_timeout"] or 0) > 0


def test_the_url_s_own_connection_settings_win(pg: PostgresUrl) -> None:
    url = f"{pg.url}&connect_timeout=3&keepalives_idle=42&tcp_user_timeout=7000"
    store = open_store(url)
    try:
        settings = _settings(store)
        assert settings["connect_timeout"] == "3"
        assert settings["keepalives_idle"] == "42"
        assert settings["tcp_user_timeout"] == "7000"
        # and the settings it leaves out keep the store's defaults
        assert settings["keepalives_interval"] == "5"
        store.jobs.enqueue("k")  # the connection works with them
    finally:
        store.close()
