"""``python manage.py jaren_worker``: run the tasks of a JarenBackend (SPEC §16)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jaren_jobs.records import Outcome


class Command(BaseCommand):
    help = (
        "Run the tasks a JarenBackend keeps (TASKS alias --backend, default 'default'): "
        "claim, run and settle them with leases, retries and crash recovery, until "
        "SIGTERM or SIGINT (which drain for up to --grace seconds) or, with --burst, until "
        "no task is due."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias")
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="a queue to serve (repeatable; default: every queue)",
        )
        parser.add_argument("--concurrency", type=int, default=1, help="tasks at once")
        parser.add_argument(
            "--burst", action="store_true", help="stop once no task is due (drains what is)"
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=None,
            help="seconds a stop waits for running tasks (default: the store's, 10)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from jaren_jobs.contrib.django.backend import JarenBackend  # noqa: PLC0415
        from jaren_jobs.contrib.django.compat import task_backends  # noqa: PLC0415
        from jaren_jobs.contrib.django.runner import make_handler  # noqa: PLC0415
        from jaren_jobs.contrib.django.stores import open_worker_store  # noqa: PLC0415

        alias = options["backend"]
        try:
            backend = task_backends[alias]
        except Exception as exc:
            raise CommandError(f"no task backend {alias!r} in TASKS: {exc}") from exc
        if not isinstance(backend, JarenBackend):
            raise CommandError(
                f"TASKS[{alias!r}] is {type(backend).__name__}, not JarenBackend: "
                "jaren_worker runs only the tasks jaren_jobs keeps"
            )
        if backend.problems:
            raise CommandError(f"TASKS[{alias!r}]: {'; '.join(backend.problems)}")
        concurrency = options["concurrency"]
        if concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, got {concurrency}")
        queues = options["queues"]
        if queues and backend.queues:
            unknown = sorted(set(queues) - set(backend.queues))
            if unknown:
                raise CommandError(
                    f"--queue {', '.join(unknown)}: not in TASKS[{alias!r}]['QUEUES'] "
                    f"({', '.join(sorted(backend.queues))})"
                )
        settings = backend.settings
        store = open_worker_store(settings.database)
        stop = threading.Event()
        counts = {"completed": 0, "failed": 0, "cancelled": 0, "lost": 0, "snoozed": 0}

        def on_outcome(outcome: Outcome) -> None:
            counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1

        idle = threading.Event()

        def on_idle() -> None:
            idle.set()

        worker = store.jobs.create_worker(
            {backend.kind: make_handler(backend, store)},
            # TaskResult.worker_ids says where each attempt ran
            owner=f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}",
            concurrency=concurrency,
            queues=queues or None,
            lease_seconds=settings.lease_seconds,
            poll_seconds=settings.poll_seconds,
            backoff_base_seconds=settings.backoff_base_seconds,
            backoff_cap_seconds=settings.backoff_cap_seconds,
            on_outcome=on_outcome,
            on_idle=on_idle,
        )
        # SIGTERM and SIGINT drain (Python lets only the main thread install handlers:
        # called from another thread, as a test may, the command stops on --burst only)
        previous = (
            {
                signum: signal.signal(signum, lambda *_: stop.set())
                for signum in (signal.SIGTERM, signal.SIGINT)
            }
            if threading.current_thread() is threading.main_thread()
            else {}
        )
        try:
            worker.start()
            self.stdout.write(
                f"jaren_worker: serving TASKS[{alias!r}] from database {settings.database!r} "
                f"({store.backend}), queues {', '.join(queues) if queues else 'all'}, "
                f"concurrency {concurrency}",
            )
            self.stdout.flush()
            burst = options["burst"]
            while not stop.wait(0.05 if burst else 0.5):
                # --burst: done once a loop found nothing due and no task is running
                if burst and idle.is_set() and worker.stats().in_flight == 0:
                    break
            outcome = worker.stop(options["grace"])
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            store.close()
        self.stdout.write(
            f"jaren_worker: stopped: {counts['completed']} completed, {counts['failed']} "
            f"failed, {counts['lost']} lost, drained={outcome.drained}"
        )
