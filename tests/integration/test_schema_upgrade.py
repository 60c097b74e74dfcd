"""Moved to tests/backends/sqlite/test_schema_upgrade.py (SQLite mechanics).

Only a re-export is left here, for ``tests/integration/test_cli.py``, which
imports ``build_pre_fence`` from this path; drop it once that import names
``tests.backends.sqlite.test_schema_upgrade``. It defines no test.
"""

from tests.backends.sqlite.test_schema_upgrade import build_pre_fence

__all__ = ["build_pre_fence"]
