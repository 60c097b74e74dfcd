"""Everything SQLite: the connection and its scopes, every statement, the schema."""
