"""The peers: workloads 1, 3, 4, 5 and 6 through huey, persist-queue and litequeue.

Each adapter uses only the peer's own public API to enqueue, take and finish
a job, on a fresh file, in WAL mode, at the run's durability: ``synchronous``
FULL or NORMAL on every connection the peer opens. Where a peer cannot be set
to match, its :attr:`Peer.notes` say so, and the report prints them.

Install them with the optional extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import json
import queue
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import POLL_SECONDS, Channels, Package, Timer

__all__ = ["PEERS", "Peer", "available_peers"]

WAIT = 600.0


def _synchronous(durability: str) -> str:
    return "PRAGMA synchronous = " + ("FULL" if durability == "full" else "NORMAL")


class Counter:
    """Counts executions from any thread; sets ``done`` at ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.at = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.target:
                self.at = time.perf_counter()
                self.done.set()


class Peer(Package):
    """One peer library's adapter. Subclasses fill in the primitives."""

    def __init__(self) -> None:
        self._errors = 0
        self._errors_lock = threading.Lock()

    def count_error(self) -> None:
        """A driver error the peer let through to its caller (a consumer retries)."""
        with self._errors_lock:
            self._errors += 1

    def take_errors(self) -> int:
        """Errors counted since the last call (and reset)."""
        with self._errors_lock:
            errors, self._errors = self._errors, 0
        return errors

    # primitives -------------------------------------------------------------
    def open(self, path: Path, durability: str) -> Any:
        raise NotImplementedError

    def close(self, handle: Any) -> None:
        raise NotImplementedError

    def put(self, handle: Any, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def take_and_finish(self, handle: Any, run: Callable[[dict[str, Any]], None]) -> bool:
        """Take one job, run ``run(payload)``, finish it; False when the queue is empty."""
        raise NotImplementedError

    def consume(
        self,
        path: Path,
        durability: str,
        concurrency: int,
        run: Callable[[dict[str, Any]], None],
        stop: threading.Event,
    ) -> Callable[[], None]:
        """Start ``concurrency`` consumers in this process; returns a joiner."""
        handles = [self.open(path, durability) for _ in range(concurrency)]

        def loop(handle: Any) -> None:
            while not stop.is_set():
                try:
                    took = self.take_and_finish(handle, run)
                except sqlite3.OperationalError:  # "database is locked": count, retry
                    self.count_error()
                    continue
                if not took:
                    stop.wait(POLL_SECONDS)

        threads = [threading.Thread(target=loop, args=(h,), daemon=True) for h in handles]
        for thread in threads:
            thread.start()

        def join() -> None:
            stop.set()
            for thread in threads:
                thread.join(30)
            for handle in handles:
                self.close(handle)

        return join

    # workloads --------------------------------------------------------------
    def enqueue_one(self, path: Path, durability: str, jobs: int) -> float:
        handle = self.open(path, durability)
        with Timer() as timer:
            for i in range(jobs):
                self.put(handle, {"n": i})
        self.close(handle)
        return jobs / timer.seconds

    def claim_complete_one(self, path: Path, durability: str, jobs: int) -> float:
        handle = self.open(path, durability)
        for i in range(jobs):
            self.put(handle, {"n": i})
        done = 0
        with Timer() as timer:
            while self.take_and_finish(handle, _ignore):
                done += 1
        self.close(handle)
        assert done == jobs, (self.name, done, jobs)
        return jobs / timer.seconds

    def drain(self, path: Path, durability: str, jobs: int, concurrency: int) -> float:
        handle = self.open(path, durability)
        for i in range(jobs):
            self.put(handle, {"n": i})
        self.close(handle)
        counter = Counter(jobs)
        stop = threading.Event()
        start = time.perf_counter()
        join = self.consume(path, durability, concurrency, lambda p: counter.hit(), stop)
        try:
            if not counter.done.wait(WAIT):
                raise TimeoutError(f"bench: {self.name} drained {counter.count} of {jobs}")
        finally:
            join()
        return jobs / (counter.at - start)

    def latency_local(self, path: Path, durability: str, samples: int) -> list[float]:
        started: queue.Queue[float] = queue.Queue()
        stop = threading.Event()
        join = self.consume(
            path, durability, 1, lambda p: started.put(time.monotonic() - p["t"]), stop
        )
        handle = self.open(path, durability)
        latencies = []
        try:
            time.sleep(POLL_SECONDS * 2)
            for n in range(samples):
                self.put(handle, {"n": n, "t": time.monotonic()})
                latencies.append(started.get(timeout=30))
        finally:
            join()
            self.close(handle)
        return latencies

    def setup_file(self, path: Path, durability: str, jobs: int) -> None:
        handle = self.open(path, durability)
        for i in range(jobs):
            self.put(handle, {"n": i})
        self.close(handle)


def _ignore(payload: dict[str, Any]) -> None:
    return None


# ---------------------------------------------------------------- huey

_HUEY_RUN: list[Callable[[dict[str, Any]], None]] = [_ignore]


def _huey_job(payload: dict[str, Any]) -> None:
    _HUEY_RUN[0](payload)


class Huey(Peer):
    """huey's ``SqliteHuey``: tasks are rows; a worker deletes the row, then runs the task."""

    name = "huey"
    package = "huey"
    notes = (
        "huey deletes a task's row when it dequeues it, before running it: a crash "
        "mid-task loses the task, and nothing records its completion (results are "
        "stored only for tasks that return a value).",
        "huey's fsync option sets synchronous FULL or OFF; for NORMAL the adapter sets it "
        "on each connection huey opens.",
        "idle huey workers poll (no in-process wake); the adapter fixes the poll at 50 ms.",
    )

    def open(self, path: Path, durability: str) -> Any:
        from huey import SqliteHuey
        from huey.storage import SqliteStorage

        class NormalStorage(SqliteStorage):  # type: ignore[misc]
            def _create_connection(self) -> sqlite3.Connection:
                conn: sqlite3.Connection = super()._create_connection()
                conn.execute("PRAGMA synchronous = NORMAL")
                return conn

        if durability == "full":
            huey = SqliteHuey("bench", filename=str(path), fsync=True, journal_mode="wal")
        else:
            huey = SqliteHuey(
                "bench", filename=str(path), journal_mode="wal", storage_class=NormalStorage
            )
        task = huey.task(name="noop")(_huey_job)
        return huey, task

    def close(self, handle: Any) -> None:
        handle[0].storage.close()

    def put(self, handle: Any, payload: dict[str, Any]) -> None:
        handle[1](payload)

    def take_and_finish(self, handle: Any, run: Callable[[dict[str, Any]], None]) -> bool:
        huey = handle[0]
        task = huey.dequeue()
        if task is None:
            return False
        _HUEY_RUN[0] = run
        huey.execute(task)
        return True

    def consume(
        self,
        path: Path,
        durability: str,
        concurrency: int,
        run: Callable[[dict[str, Any]], None],
        stop: threading.Event,
    ) -> Callable[[], None]:
        from huey.consumer import Consumer

        huey, _ = self.open(path, durability)
        _HUEY_RUN[0] = run
        consumer = Consumer(
            huey,
            workers=concurrency,
            worker_type="thread",
            periodic=False,
            initial_delay=POLL_SECONDS,
            backoff=1.0,
            max_delay=POLL_SECONDS,
            check_worker_health=False,
        )
        # Consumer.start() installs SIGINT/SIGTERM handlers; put ours back after
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        consumer.start()

        def join() -> None:
            stop.set()
            consumer.stop(graceful=True)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
            huey.storage.close()

        return join


# ---------------------------------------------------------------- persist-queue


class PersistQueue(Peer):
    """persist-queue's ``SQLiteAckQueue``: get marks a row unacked; ack marks it acked."""

    name = "persist-queue"
    package = "persist-queue"
    notes = (
        "persist-queue reads the next row and marks it taken in two statements with no "
        "transaction around them, so two processes can take the same row; a queue opened "
        "with auto_resume=True also returns every unacked row to ready.",
        "persist-queue does not set synchronous; the adapter sets it on both of its "
        "connections (private attributes _conn and _putter).",
        "across processes it has no wake-up: the adapter polls get(timeout=50 ms).",
    )

    def open(self, path: Path, durability: str) -> Any:
        from persistqueue import SQLiteAckQueue

        q = SQLiteAckQueue(
            str(path), multithreading=True, auto_commit=True, db_file_name="queue.db"
        )
        for conn in {id(q._conn): q._conn, id(q._putter): q._putter}.values():
            assert conn is not None  # both are open once the queue is constructed
            conn.execute(_synchronous(durability))
        return q

    def close(self, handle: Any) -> None:
        handle.close()

    def put(self, handle: Any, payload: dict[str, Any]) -> None:
        handle.put(payload)

    def take_and_finish(self, handle: Any, run: Callable[[dict[str, Any]], None]) -> bool:
        from persistqueue.exceptions import Empty

        try:
            item = handle.get(block=False, raw=True)
        except Empty:
            return False
        run(item["data"])
        handle.ack(id=item["pqid"])
        return True

    def consume(
        self,
        path: Path,
        durability: str,
        concurrency: int,
        run: Callable[[dict[str, Any]], None],
        stop: threading.Event,
    ) -> Callable[[], None]:
        from persistqueue.exceptions import Empty

        # one queue object shared by the threads (its multithreading mode);
        # an in-process put() wakes a blocked get()
        q = self.open(path, durability)

        def loop() -> None:
            while not stop.is_set():
                try:
                    item = q.get(block=True, timeout=POLL_SECONDS, raw=True)
                except Empty:
                    continue
                except sqlite3.OperationalError:
                    self.count_error()
                    continue
                run(item["data"])
                try:
                    q.ack(id=item["pqid"])
                except sqlite3.OperationalError:
                    self.count_error()

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(concurrency)]
        for thread in threads:
            thread.start()

        def join() -> None:
            stop.set()
            for thread in threads:
                thread.join(30)
            q.close()

        return join

    def latency_local(self, path: Path, durability: str, samples: int) -> list[float]:
        # the producer must be the consumers' own queue object for put() to wake get()
        from persistqueue.exceptions import Empty

        q = self.open(path, durability)
        started: queue.Queue[float] = queue.Queue()
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    item = q.get(block=True, timeout=POLL_SECONDS, raw=True)
                except Empty:
                    continue
                started.put(time.monotonic() - item["data"]["t"])
                q.ack(id=item["pqid"])

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        latencies = []
        try:
            time.sleep(POLL_SECONDS * 2)
            for n in range(samples):
                q.put({"n": n, "t": time.monotonic()})
                latencies.append(started.get(timeout=30))
        finally:
            stop.set()
            thread.join(30)
            q.close()
        return latencies


# ---------------------------------------------------------------- litequeue


class LiteQueue(Peer):
    """litequeue's ``LiteQueue``: pop marks a message locked; done marks it done."""

    name = "litequeue"
    package = "litequeue"
    notes = (
        "litequeue sets synchronous NORMAL when it opens; the adapter sets the run's "
        "durability on its connection afterwards.",
        "litequeue has no wake-up or blocking pop: its consumers poll every 50 ms, "
        "in-process too, and each thread has its own LiteQueue (it shares no connection "
        "safely).",
    )

    def open(self, path: Path, durability: str) -> Any:
        from litequeue import LiteQueue as Queue

        q = Queue(str(path), queue_name="bench", timeout=5.0)
        q.conn.execute(_synchronous(durability))
        return q

    def close(self, handle: Any) -> None:
        handle.conn.close()

    def put(self, handle: Any, payload: dict[str, Any]) -> None:
        handle.put(json.dumps(payload))

    def take_and_finish(self, handle: Any, run: Callable[[dict[str, Any]], None]) -> bool:
        message = handle.pop()
        if message is None:
            return False
        run(json.loads(message.data))
        handle.done(message.message_id)
        return True


PEERS: dict[str, Peer] = {p.name: p for p in (Huey(), PersistQueue(), LiteQueue())}


def available_peers() -> list[Peer]:
    return [peer for peer in PEERS.values() if peer.available()]


# ---------------------------------------------------------------- child processes


def process_drainer(spec: dict[str, Any], channels: Channels) -> None:
    """Workload 5 child: one consumer of the named peer in this process."""
    peer = PEERS[spec["peer"]]
    halt = threading.Event()

    def run(payload: dict[str, Any]) -> None:
        channels.executed(payload["n"])

    channels.ready.set()
    channels.go.wait()
    join = peer.consume(Path(spec["path"]), spec["durability"], spec["concurrency"], run, halt)
    channels.stop.wait()
    join()
    channels.errors.value = peer.take_errors()


def latency_consumer(spec: dict[str, Any], reports: Any, ready: Any, stop: Any) -> None:
    """Workload 6 child: one consumer of the named peer, reporting each start."""
    peer = PEERS[spec["peer"]]
    halt = threading.Event()

    def run(payload: dict[str, Any]) -> None:
        reports.put((payload["n"], time.monotonic() - payload["t"]))

    join = peer.consume(Path(spec["path"]), spec["durability"], 1, run, halt)
    ready.set()
    stop.wait()
    join()
