"""A griffe extension for the docs site: Sphinx roles in docstrings become code spans.

The docstrings cite names the Sphinx way (``:class:`~jaren_jobs.UnknownJob```,
``:meth:`release```), which Markdown would print as is. mkdocs.yml loads this
file (``extensions:`` of the python handler) so the rendered reference shows
``UnknownJob`` and ``release()`` instead, as Sphinx would. Plain code, not
links: many roles name private modules, which the reference never renders.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :class:`Name`, :meth:`~a.b.name`, :mod:`a.b` ... (the role's target has no backtick)
ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|attr|exc|data|mod|obj):`(?P<target>[^`]+)`")
CALLABLE_ROLES = {"func", "meth"}


def code_span(match: re.Match[str]) -> str:
    target = match.group("target")
    shown = target.lstrip("~")
    if target.startswith("~"):
        shown = shown.rsplit(".", 1)[-1]  # Sphinx's "~": only the last part of the path
    if match.group("role") in CALLABLE_ROLES and not shown.endswith(")"):
        shown += "()"
    return f"`{shown}`"


def plain_roles(text: str) -> str:
    return ROLE.sub(code_span, text)


class SphinxRolesAsCode(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
