"""The job list's filters, as the pages and the JSON API both read them (checked in ``core``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_LIMIT", "Filters"]

DEFAULT_LIMIT = 50


@dataclass(frozen=True)
class Filters:
    state: str | None = None
    kind: str | None = None
    queue: str | None = None
    after: str | None = None
    limit: int = DEFAULT_LIMIT
    order: str = "id"

    def query(self, **changes: Any) -> dict[str, str]:
        values = {
            "state": self.state,
            "kind": self.kind,
            "queue": self.queue,
            "after": self.after,
            "limit": str(self.limit) if self.limit != DEFAULT_LIMIT else None,
            "order": self.order if self.order != "id" else None,
        }
        values.update(changes)
        return {key: value for key, value in values.items() if value is not None}
