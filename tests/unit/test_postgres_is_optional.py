"""psycopg is an optional extra (SPEC §10): SQLite never imports it; a URL without it says so."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_sqlite_path_never_imports_psycopg(tmp_path: Path) -> None:
    done = _run(
        """
        import sys
        import jaren_jobs
        with jaren_jobs.open_store("app.db") as store:
            store.jobs.enqueue("k")
            store.jobs.create_worker({"k": lambda p, c: None}).run_once()
        assert store.backend == "sqlite"
        assert not any(name.split(".")[0] == "psycopg" for name in sys.modules), "imported"
        print("ok")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_postgres_url_without_psycopg_is_an_import_error_naming_the_extra(
    tmp_path: Path,
) -> None:
    done = _run(
        """
        import sys
        sys.modules["psycopg"] = None  # as if the extra were not installed
        import jaren_jobs
        try:
            jaren_jobs.open_store("postgresql://app@db.internal/app")
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "jaren_jobs[postgres]" in done.stdout
    assert not (tmp_path / "postgresql:").exists()  # never taken for an SQLite path
