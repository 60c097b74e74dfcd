"""JarenBackend in the test project's own process (SPEC §16), on SQLite and PostgreSQL.

The view goes through Django's test client; tasks run in a worker started by
``call_command("jaren_worker", "--burst")`` here (the separate-process worker,
SIGTERM and SIGKILL are in test_worker_processes.py).
"""

from __future__ import annotations

import math
import os
import pickle
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

WAIT = 30.0


def jobs_of(alias: str) -> list[tuple[Any, ...]]:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute('SELECT id, kind, state, queue, priority FROM "_jaren_jobs" ORDER BY id')
        return list(cursor.fetchall())


def drain(alias: str, *, until: Any = None, rounds: int = 50) -> None:
    """Run the backend's worker in burst mode (again, while ``until()`` is false: a retry
    waits out its backoff)."""
    from django.core.management import call_command

    for _ in range(rounds):
        call_command("jaren_worker", "--backend", alias, "--burst", "--concurrency", "2")
        if until is None or until():
            return
    raise AssertionError("the tasks never reached the expected state")


def tasks() -> Any:
    from shop import tasks as shop_tasks

    return shop_tasks


# ---------------------------------------------------------------- the view, atomic()


def test_the_capability_flags(alias: str) -> None:
    from jaren_jobs.contrib.django import JarenBackend
    from jaren_jobs.contrib.django.compat import task_backends

    backend = task_backends[alias]
    assert isinstance(backend, JarenBackend)
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True


def test_a_view_that_commits_leaves_one_job_and_one_that_rolls_back_none(alias: str) -> None:
    from django.test import Client
    from shop.models import Order

    client = Client()
    refused = client.get(f"/orders/{alias}?fail=1")
    assert refused.status_code == 400
    assert jobs_of(alias) == []
    assert Order.objects.using(alias).count() == 0

    placed = client.get(f"/orders/{alias}")
    assert placed.status_code == 200, placed.content
    body = placed.json()
    assert body["status"] == "READY"
    assert [row[0] for row in jobs_of(alias)] == [body["task"]]
    assert Order.objects.using(alias).count() == 1

    drain(alias)
    result = tasks().ship.using(backend=alias).get_result(body["task"])
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"order": body["order"], "attempt": 1}
    assert result.attempts == 1
    assert len(result.worker_ids) == 1
    host, pid, _ = result.worker_ids[0].rsplit(":", 2)
    assert host == socket.gethostname()
    assert int(pid) == os.getpid()  # the in-process worker of drain()
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_a_nested_atomic_rolled_back_takes_only_its_own_job(alias: str) -> None:
    from django.db import transaction

    ship = tasks().ship.using(backend=alias)
    with transaction.atomic(using=alias):
        kept = ship.enqueue(order_id=1)
        try:
            with transaction.atomic(using=alias):
                ship.enqueue(order_id=2)
                raise RuntimeError("the inner block fails")
        except RuntimeError:
            pass
        # still inside the outer block: nothing is visible to anyone else yet
    assert [row[0] for row in jobs_of(alias)] == [kept.id]


def test_an_enqueue_outside_atomic_commits_at_once(alias: str) -> None:
    result = tasks().ship.using(backend=alias).enqueue(order_id=7)
    assert [row[0] for row in jobs_of(alias)] == [result.id]
    assert result.args == []
    assert result.kwargs == {"order_id": 7}


def test_get_result_inside_atomic_leaves_the_transaction_open(alias: str) -> None:
    from django.db import connections, transaction
    from shop.models import Order

    ship = tasks().ship.using(backend=alias)
    with transaction.atomic(using=alias):
        Order.objects.using(alias).create(item="kept")
        result = ship.enqueue(order_id=1)
        assert ship.get_result(result.id).status == "READY"
        assert connections[alias].in_atomic_block
        Order.objects.using(alias).create(item="kept too")
    assert Order.objects.using(alias).count() == 2
    assert [row[0] for row in jobs_of(alias)] == [result.id]


# ---------------------------------------------------------------- results


def test_a_failing_task_retries_then_fails_with_one_error_per_attempt(alias: str) -> None:
    failing = tasks().always_fails.using(backend=alias)
    result = failing.enqueue()

    def settled() -> bool:
        return failing.get_result(result.id).is_finished

    drain(alias, until=settled)
    final = failing.get_result(result.id)
    assert final.status == "FAILED"
    assert final.attempts == 2
    assert [e.exception_class_path for e in final.errors] == ["builtins.KeyError"] * 2
    assert final.errors[0].exception_class is KeyError
    assert "nope" in final.errors[0].traceback
    assert "Traceback" in final.errors[0].traceback
    assert final.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = final.return_value


def test_a_task_that_fails_once_then_succeeds(alias: str, tmp_path: Path) -> None:
    flaky = tasks().flaky.using(backend=alias)
    result = flaky.enqueue(1, str(tmp_path / "runs"))

    drain(alias, until=lambda: flaky.get_result(result.id).is_finished)
    final = flaky.get_result(result.id)
    assert final.status == "SUCCESSFUL"
    assert final.return_value == "ok"
    assert final.attempts == 2
    assert [e.exception_class_path for e in final.errors] == ["builtins.ValueError"]
    assert final.started_at < final.last_attempted_at


def test_system_exit_and_unjsonable_results_fail_the_task(alias: str) -> None:
    shop = tasks()
    exits = shop.exits.using(backend=alias, max_attempts=1).enqueue()
    odd = shop.returns_unjsonable.using(backend=alias, max_attempts=1).enqueue()
    drain(alias)
    exited = shop.exits.using(backend=alias).get_result(exits.id)
    assert exited.status == "FAILED"
    assert [e.exception_class_path for e in exited.errors] == ["builtins.SystemExit"]
    unjsonable = shop.returns_unjsonable.using(backend=alias).get_result(odd.id)
    assert unjsonable.status == "FAILED"
    assert [e.exception_class_path for e in unjsonable.errors] == ["builtins.TypeError"]


def test_an_async_task_runs_and_priority_and_queue_are_kept(alias: str) -> None:
    from asgiref.sync import async_to_sync

    send = tasks().send_email.using(backend=alias)
    result = async_to_sync(send.aenqueue)("a@example.com")
    assert (result.task.queue_name, result.task.priority) == ("emails", 10)
    assert jobs_of(alias)[0][3:] == ("emails", 10)
    drain(alias)
    final = async_to_sync(send.aget_result)(result.id)
    assert final.status == "SUCCESSFUL"
    assert final.return_value == "sent to a@example.com"


def test_run_after_defers_the_task(alias: str) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    ship = tasks().ship.using(backend=alias, run_after=later)
    result = ship.enqueue(order_id=1)
    drain(alias)
    again = ship.get_result(result.id)
    assert again.status == "READY"
    assert again.task.run_after == later


def test_unique_key_enqueues_once_while_the_first_is_queued(alias: str) -> None:
    ship = tasks().ship.using(backend=alias, unique_key="order-1")
    first = ship.enqueue(order_id=1)
    second = ship.enqueue(order_id=1)
    assert second.id == first.id
    assert len(jobs_of(alias)) == 1


def test_signals_are_sent_with_the_task_result(alias: str) -> None:
    from jaren_jobs.contrib.django.compat import task_enqueued, task_finished, task_started

    seen: list[tuple[str, str, str]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, task_result.id, str(task_result.status)))

        return receive

    receivers = {
        "enqueued": receiver("enqueued"),
        "started": receiver("started"),
        "finished": receiver("finished"),
    }
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        result = tasks().ship.using(backend=alias).enqueue(order_id=3)
        drain(alias)
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    assert seen == [
        ("enqueued", result.id, "READY"),
        ("started", result.id, "RUNNING"),
        ("finished", result.id, "SUCCESSFUL"),
    ]


def test_an_unknown_result_id_does_not_exist(alias: str) -> None:
    from jaren_jobs.contrib.django.compat import TaskResultDoesNotExist

    ship = tasks().ship.using(backend=alias)
    for missing in ("123", "", "a\x00b"):
        with pytest.raises(TaskResultDoesNotExist):
            ship.get_backend().get_result(missing)


def test_task_and_task_result_pickle(alias: str) -> None:
    ship = tasks().ship.using(backend=alias, max_attempts=2)
    assert pickle.loads(pickle.dumps(ship)) == ship
    result = ship.enqueue(order_id=1)
    assert pickle.loads(pickle.dumps(result)) == result
    assert ship.get_result(result.id) == result


# ---------------------------------------------------------------- bad input


def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing(alias: str) -> None:
    from jaren_jobs.contrib.django import JarenTask
    from jaren_jobs.contrib.django.compat import InvalidTask

    shop = tasks()
    ship = shop.ship.using(backend=alias)

    def hidden() -> None:
        pass

    hidden.__qualname__ = "hidden"
    hidden.__module__ = "shop.no_such_module"
    lost = JarenTask(func=hidden, backend=alias)
    with pytest.raises(InvalidTask, match="cannot be imported by its module path"):
        lost.enqueue()
    with pytest.raises(InvalidTask, match="does not name this task in its module"):
        shop.aliased.using(backend=alias).enqueue()

    with pytest.raises(TypeError, match="Unsupported type"):
        ship.enqueue(order_id=datetime.now(timezone.utc))
    with pytest.raises(ValueError, match=r"(?i)nan|json"):
        ship.enqueue(order_id=math.nan)
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        ship.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        ship.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        ship.using(run_after=datetime.now())  # the naive one is the point
    with pytest.raises(InvalidTask, match="max_attempts must be an int >= 1"):
        ship.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="backoff_base_seconds"):
        ship.using(backoff_base_seconds=-1)
    with pytest.raises(TypeError, match="unknown options"):
        ship.using(retries=3)
    assert jobs_of(alias) == []


def test_the_system_checks_name_bad_options(project: Path) -> None:
    from jaren_jobs.contrib.django import JarenBackend

    backend = JarenBackend(
        "broken",
        {
            "QUEUES": [],
            "OPTIONS": {"DATABASE": "nowhere", "MAX_ATTEMPTS": 0, "LEASE": 3},
        },
    )
    messages = [(m.id, m.msg) for m in backend.check()]
    ids = [i for i, _ in messages]
    assert ids.count("jaren_jobs.E001") == 3, messages
    text = " ".join(msg for _, msg in messages)
    assert "'nowhere'" in text
    assert "MAX_ATTEMPTS" in text
    assert "OPTIONS['LEASE'] is not an option" in text
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="nowhere"):
        backend.get_result("x")


def test_manage_py_check_is_clean(project: Path) -> None:
    from django.core.management import call_command

    call_command("check", fail_level="WARNING")
