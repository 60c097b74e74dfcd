"""The NOTIFY channels of a schema's queue, derived identically in every process.

A channel is an identifier of at most 63 bytes. A name that fits keeps its
readable form (``jaren_jobs.<schema>``, the same as earlier releases, so a
rolling upgrade keeps hearing them); one that does not is replaced by a
SHA-256 digest of the text it would have been. The digest, never Python's
``hash()``: that one is salted per process, and a channel two processes
derive differently is a wake-up lost without a word.
"""

from __future__ import annotations

import hashlib

__all__ = ["MAX_IDENTIFIER_BYTES", "cancel_channel", "channel_name", "settled_channel"]

MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL truncates longer identifiers


def _fitted(name: str, *, prefix: str, suffix: str) -> str:
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    return f"{prefix}{digest}{suffix}"


def channel_name(schema: str) -> str:
    """The channel an enqueue into ``schema``'s tables notifies (idle workers listen)."""
    return _fitted(f"jaren_jobs.{schema}", prefix="jaren_jobs.", suffix="")


def settled_channel(channel: str) -> str:
    """The channel a settlement's NOTIFY goes to (``wait()`` listens), beside the enqueue one.

    Its own channel, so that settlements never wake idle workers to claim.
    """
    return _fitted(f"{channel}.settled", prefix="jaren_jobs.", suffix=".settled")


def cancel_channel(channel: str) -> str:
    """The channel ``cancel(id, force=True)`` of a running job notifies, naming the job.

    Its own channel: only the process holding that job's attempt acts on it
    (it renews that lease at once), and nothing else wakes for it.
    """
    return _fitted(f"{channel}.cancel", prefix="jaren_jobs.", suffix=".cancel")
