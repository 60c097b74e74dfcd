"""The PostgreSQL fixtures of :mod:`tests.processes.pg_support`, for every test here."""

from tests.processes.pg_support import pg_schema, private_pg

__all__ = ["pg_schema", "private_pg"]
