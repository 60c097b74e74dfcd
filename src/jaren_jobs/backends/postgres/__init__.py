"""The PostgreSQL backend (psycopg 3), behind the same seam as SQLite (SPEC §10)."""
