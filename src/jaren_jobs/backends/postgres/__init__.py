"""The PostgreSQL backend (SPEC §10): psycopg 3, imported only here."""
