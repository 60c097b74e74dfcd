"""The runtime record and the store's defaults.

Every clock read, jitter draw and identifier in the library goes through a
:class:`Runtime`; this module is the only one allowed to touch the platform
clock, ``random`` and ``uuid`` (a ruff banned-API rule keeps it so).
"""

from __future__ import annotations

import math
import os
import random as _random
import time as _time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["Defaults", "ResolvedRuntime", "Runtime", "resolve_defaults", "resolve_runtime"]

# SystemRandom draws from os.urandom: jitter need not be secret, but one
# generator for everything keeps the platform defaults simple to reason about.
_SYSTEM_RANDOM = _random.SystemRandom()


_urandom = os.urandom
_floor = math.floor


def _platform_uuid() -> str:
    """A random (version 4) UUID from os.urandom, as ``str(uuid.uuid4())`` would spell it.

    Unguessable, which is what a lease token needs; built from the hex
    digits directly, at a third of the cost of going through ``uuid.UUID``.
    """
    return _platform_uuids(1)[0]


def _platform_uuids(count: int) -> list[str]:
    """``count`` platform UUIDs from one os.urandom read (16 random bytes each)."""
    h = _urandom(16 * count).hex()
    # the version nibble is 4; the variant's top two bits are 10 (8, 9, a or b)
    return [
        f"{h[a : a + 8]}-{h[a + 8 : a + 12]}-4{h[a + 13 : a + 16]}-"
        f"{_VARIANT[h[a + 16]]}{h[a + 17 : a + 20]}-{h[a + 20 : a + 32]}"
        for a in range(0, 32 * count, 32)
    ]


_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


@dataclass(frozen=True)
class Runtime:
    """Injectable clock, randomness and identifiers.

    ``now() -> float`` epoch seconds; ``random() -> float`` in [0, 1);
    ``uuid() -> str``. A field left ``None`` takes the platform default.
    """

    now: Callable[[], float] | None = None
    random: Callable[[], float] | None = None
    uuid: Callable[[], str] | None = None


@dataclass(frozen=True)
class ResolvedRuntime:
    """A :class:`Runtime` with every field filled in."""

    now: Callable[[], float]
    random: Callable[[], float]
    uuid: Callable[[], str]

    def now_ms(self) -> int:
        """The clock as integer epoch milliseconds, rounded down."""
        return _floor(self.now() * 1000)

    def uuids(self, count: int) -> list[str]:
        """``count`` identifiers, as ``count`` calls of :attr:`uuid` in a row would give.

        The platform default reads its randomness for all of them at once.
        """
        if self.uuid is _platform_uuid:
            return _platform_uuids(count)
        uuid = self.uuid
        return [uuid() for _ in range(count)]


def resolve_runtime(runtime: Runtime | None) -> ResolvedRuntime:
    if runtime is None:
        runtime = Runtime()
    if not isinstance(runtime, Runtime):
        raise TypeError(f"runtime must be a jaren_jobs.Runtime, got {type(runtime).__name__}")
    for name in ("now", "random", "uuid"):
        value = getattr(runtime, name)
        if value is not None and not callable(value):
            raise TypeError(f"Runtime.{name} must be callable or None, got {type(value).__name__}")
    return ResolvedRuntime(
        now=runtime.now or _time.time,
        random=runtime.random or _SYSTEM_RANDOM.random,
        uuid=runtime.uuid or _platform_uuid,
    )


@dataclass(frozen=True)
class Defaults:
    """Store-wide defaults; every one is overridable per call or per worker."""

    lease_seconds: float = 30.0
    poll_seconds: float = 1.0
    max_attempts: int = 5
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 600.0
    stop_grace_seconds: float = 10.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_attempts":
                check_positive_int(value, "Defaults.max_attempts")
            elif f.name == "stop_grace_seconds":
                check_seconds(value, "Defaults.stop_grace_seconds", allow_zero=True)
            else:
                check_seconds(value, f"Defaults.{f.name}")


def resolve_defaults(defaults: Defaults | Mapping[str, Any] | None) -> Defaults:
    if defaults is None:
        return Defaults()
    if isinstance(defaults, Defaults):
        return defaults
    if isinstance(defaults, Mapping):
        known = {f.name for f in fields(Defaults)}
        unknown = sorted(str(k) for k in defaults if k not in known)
        if unknown:
            raise ValueError(f"unknown defaults key(s) {unknown}; expected some of {sorted(known)}")
        return Defaults(**dict(defaults))
    raise TypeError(f"defaults must be a Defaults or a dict, got {type(defaults).__name__}")


# the longest duration accepted: a century keeps every deadline computed from
# one within both an SQLite INTEGER of milliseconds and a datetime
MAX_SECONDS = 100 * 366 * 86_400.0
_INT64_MAX = 2**63 - 1


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """Validate a duration in seconds: finite, > 0 (or >= 0), and at most a century."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"{what} must be at most a century ({MAX_SECONDS:.0f} s), got {value!r}")
    return float(value)


def check_positive_int(value: object, what: str) -> int:
    """Validate a positive integer that fits SQLite's 64-bit INTEGER (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value!r}")
    if value > _INT64_MAX:
        raise ValueError(f"{what} must fit in 64 bits (at most {_INT64_MAX}), got {value!r}")
    return value
