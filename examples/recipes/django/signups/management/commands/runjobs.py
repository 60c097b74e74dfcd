# examples/recipes/django/signups/management/commands/runjobs.py
import signal
import threading

from django.core.management.base import BaseCommand

from signups.jobs import HANDLERS
from signups.queue import get_store


class Command(BaseCommand):
    help = "Run a jaren_jobs worker until SIGTERM or SIGINT."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--grace", type=float, default=20.0)

    def handle(self, *args, **options):
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stopping.set())
        store = get_store()
        worker = store.jobs.create_worker(HANDLERS, concurrency=options["concurrency"])
        worker.start()
        self.stdout.write("worker started; SIGTERM or SIGINT stops it", ending="\n")
        self.stdout.flush()
        stopping.wait()
        outcome = worker.stop(options["grace"])  # in-flight jobs finish or are handed back
        stats = worker.stats()
        self.stdout.write(f"stopped: {stats.completions} completed, drained={outcome.drained}")
        store.close()
        if not outcome.drained:
            raise SystemExit(1)
