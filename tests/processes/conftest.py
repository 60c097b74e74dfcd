"""The PostgreSQL fixtures of :mod:`tests.processes.pg_support`, for every test here."""

from tests.processes.pg_support import pg_schema, pg_schema_any_length, private_pg

__all__ = ["pg_schema", "pg_schema_any_length", "private_pg"]
