"""The async surface is the sync one, awaited: same names, same parameters (SPEC §11).

The async classes are thin shells over the sync engine; this keeps them in
step. A name the async side lacks on purpose is listed with the reason, and
the list may only shrink.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from jaren_jobs import (
    AsyncCheckpointStore,
    AsyncCursor,
    AsyncJobs,
    AsyncStore,
    AsyncTransaction,
    AsyncWorker,
    CheckpointStore,
    Cursor,
    Store,
    Transaction,
    Worker,
)
from jaren_jobs.store import Jobs

# sync name -> why the async surface does not have it (yet)
NOT_YET: dict[str, str] = {
    "Store.connection": "the driver's connection is used from the loop only inside a lane",
    "Store.join_transaction": (
        "an application's transaction is joined on the thread that holds its connection "
        "(Django's aenqueue runs the sync one through sync_to_async)"
    ),
}
# what the library itself calls on a sync transaction (the seam's TransactionState), not
# the application: its async twin delegates to the sync transaction, which keeps them
INTERNAL = {
    "Transaction.check_active",
    "Transaction.rolled_back",
    "Transaction.explain",
    # the thread worker's parts, read by the AsyncWorker that hosts it (its queue runs,
    # renewals, grace end) and by tests; the AsyncWorker exposes the worker itself
    "Worker.tracker",
    "Worker.claims",
    "Worker.runner",
    "Worker.settler",
    "Worker.renewer",
    "Worker.loops",
    "Worker.observers",
}
# names whose async form differs in kind, as SPEC §11 says
# (stats() and leases() read what the worker holds in memory: no I/O, nothing to await)
NOT_COROUTINES = {
    "page",
    "checkpoints_for",
    "transaction",
    "after_commit",
    "create_worker",
    "stats",
    "leases",
}

PAIRS = [
    (Jobs, AsyncJobs),
    (Store, AsyncStore),
    (Transaction, AsyncTransaction),
    (CheckpointStore, AsyncCheckpointStore),
    (Cursor, AsyncCursor),
    (Worker, AsyncWorker),
]


def _public(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    signature = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("sync", "asynchronous"), PAIRS, ids=[s.__name__ for s, _ in PAIRS])
def test_every_sync_name_has_its_async_twin_with_the_same_parameters(
    sync: type, asynchronous: type
) -> None:
    async_members = _public(asynchronous)
    for name, member in _public(sync).items():
        key = f"{sync.__name__}.{name}"
        if key in NOT_YET:
            assert name not in async_members, f"{key} exists now: take it off NOT_YET"
            continue
        if key in INTERNAL:
            continue
        assert name in async_members, f"{asynchronous.__name__} lacks {name}"
        twin = async_members[name]
        if isinstance(member, property):
            assert isinstance(twin, property), f"{asynchronous.__name__}.{name} is a property"
            continue
        assert _parameters(twin) == _parameters(member), f"{key} and its twin differ"
        if name not in NOT_COROUTINES:
            assert inspect.iscoroutinefunction(twin), f"{asynchronous.__name__}.{name} is async"


def test_the_not_yet_list_names_real_sync_members() -> None:
    for key in NOT_YET:
        owner, name = key.split(".")
        cls = {"Jobs": Jobs, "Store": Store}[owner]
        assert name in _public(cls), key
