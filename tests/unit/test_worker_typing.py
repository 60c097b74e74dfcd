"""``create_worker`` is typed end to end (SPEC §7 "Typing"): every option a typed keyword."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from jaren_jobs import Worker, open_store
from jaren_jobs.engine.engine import EngineHub
from jaren_jobs.store import Jobs

SPEC_OPTIONS = {
    "concurrency",
    "poll_seconds",
    "lease_seconds",
    "owner",
    "renew",
    "on_outcome",
    "backoff_base_seconds",
    "backoff_cap_seconds",
    "stop_grace_seconds",
}


def test_create_worker_declares_every_option_and_returns_a_worker() -> None:
    signature = inspect.signature(Jobs.create_worker)
    params = dict(signature.parameters)
    assert list(params)[:2] == ["self", "handlers"]
    options = {name: p for name, p in params.items() if name not in ("self", "handlers")}
    assert set(options) >= SPEC_OPTIONS
    # no **options: a misspelt option is a TypeError at the call, and a type checker sees it
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options.values())
    hints = typing.get_type_hints(Jobs.create_worker)
    assert hints["return"] is Worker
    assert set(options) <= set(hints)
    assert typing.Any not in (hints[name] for name in options)


def test_store_and_transaction_jobs_build_workers_without_an_untyped_callback(
    tmp_path: Path,
) -> None:
    assert "worker_factory" not in {f.name for f in EngineHub.__dataclass_fields__.values()}
    with open_store(tmp_path / "t.db") as store:
        assert isinstance(store.jobs, Jobs)
        worker = store.jobs.create_worker({"k": lambda payload, ctx: None})
        assert isinstance(worker, Worker)
        with store.transaction() as tx:
            assert isinstance(tx.jobs, Jobs)
            assert isinstance(tx.jobs.create_worker({"k": lambda payload, ctx: None}), Worker)
