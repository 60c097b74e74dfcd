"""Django's own tasks tests (``tests/tasks/`` of the Django sdist) against JarenBackend.

``python run.py UPSTREAM_DIR WORKDIR``: copies the upstream tests into WORKDIR as the
package ``tasks`` (their module paths say ``tasks.tasks.…``), substitutes the backend
— DummyBackend's path and class become JarenBackend's, ``default_task_backend.results``
the stored results, ImmediateBackend a JarenBackend that drains the queue with
``jaren_worker --burst`` after each enqueue — and runs them with Django's test runner.
Tests that cannot apply to a database backend are skipped with the reason, listed in
``NOT_APPLICABLE``. Exit status 0 when everything that applies passed.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent

# module.Class.test -> why it cannot apply to JarenBackend
NOT_APPLICABLE = {
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "mutates the dummy's in-memory result object, then expects refresh() to read the "
        "change back; a database backend's results are copies of stored rows"
    ),
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": (
        "the same, through arefresh()"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        "pins that ImmediateBackend has no get_result; JarenBackend supports it"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
        "pins that ImmediateBackend cannot refresh a result; JarenBackend can"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "pins that ImmediateBackend refuses run_after; JarenBackend supports defer"
    ),
    "test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "expects a task's KeyboardInterrupt to reach the caller of enqueue(); a worker "
        "runs the task in its own thread, where it fails the attempt"
    ),
    "test_immediate_backend.ImmediateBackendTransactionTestCase"
    ".test_doesnt_wait_until_transaction_commit_by_default": (
        "expects the task to have run inside the open atomic() block; JarenBackend "
        "enqueues inside the transaction, so no worker can see the task before the commit "
        "(the point of it)"
    ),
}
# whole modules left out, and why
MODULES_LEFT_OUT = {
    "test_custom_backend": (
        "tests the framework's support for custom backend classes the test module itself "
        "defines; nothing of a backend's behaviour to substitute"
    ),
}
MODULES = ("test_tasks", "test_dummy_backend", "test_immediate_backend")

DUMMY_PATH = "django.tasks.backends.dummy.DummyBackend"
IMMEDIATE_PATH = "django.tasks.backends.immediate.ImmediateBackend"


def rewrite(module: str, text: str) -> str:
    """The upstream module with the backend substituted (see the module docstring)."""
    text = text.replace(DUMMY_PATH, "jaren_jobs.contrib.django.JarenBackend")
    text = text.replace(
        "from django.tasks.backends.dummy import DummyBackend",
        "from jaren_jobs.contrib.django import JarenBackend as DummyBackend",
    )
    text = text.replace("default_task_backend.results", "jaren_results(default_task_backend)")
    if module == "test_immediate_backend":
        text = text.replace(IMMEDIATE_PATH, "upstream.support.DrainingBackend")
        text = text.replace(
            "from django.tasks.backends.immediate import ImmediateBackend",
            "from upstream.support import DrainingBackend as ImmediateBackend",
        )
    header = "from upstream.support import jaren_results  # noqa\n"
    return header + text


def prepare(upstream: Path, workdir: Path) -> None:
    package = workdir / "tasks"
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    for name in ("__init__.py", "tasks.py"):
        shutil.copy(upstream / name, package / name)
    for module in MODULES:
        source = (upstream / f"{module}.py").read_text(encoding="utf-8")
        (package / f"{module}.py").write_text(rewrite(module, source), encoding="utf-8")


def mark_not_applicable(suite: unittest.TestSuite) -> None:
    from upstream.support import clear_jobs

    for test in _flatten(suite):
        # the dummy and immediate backends keep nothing in a database; JarenBackend does
        if not type(test).databases:
            type(test).databases = {"default"}
        name = re.sub(r"^tasks\.", "", test.id())
        if name in NOT_APPLICABLE:
            setattr(test, test._testMethodName, unittest.skip(NOT_APPLICABLE[name])(lambda: None))
            continue
        set_up = test.setUp

        def with_clear(set_up=set_up) -> None:  # type: ignore[no-untyped-def]
            clear_jobs()
            set_up()

        test.setUp = with_clear  # type: ignore[method-assign]


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    found: list[unittest.TestCase] = []
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            found.extend(_flatten(item))
        else:
            found.append(item)
    return found


def main(argv: list[str]) -> int:
    upstream, workdir = Path(argv[0]), Path(argv[1])
    prepare(upstream, workdir)
    os.environ["JAREN_UPSTREAM_WORKDIR"] = str(workdir)
    os.environ["DJANGO_SETTINGS_MODULE"] = "upstream.settings"
    # the upstream async tests call sync APIs (refresh(), the results list) from their
    # coroutines: harmless for an in-memory dummy, refused by Django's ORM unless allowed
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    sys.path[:0] = [str(workdir), str(HERE.parent)]
    import django
    from django.test.runner import DiscoverRunner

    django.setup()
    for module, reason in MODULES_LEFT_OUT.items():
        print(f"left out: tasks.{module}: {reason}")
    suite = unittest.TestSuite(
        unittest.defaultTestLoader.loadTestsFromName(f"tasks.{module}") for module in MODULES
    )
    mark_not_applicable(suite)
    runner = DiscoverRunner(verbosity=2, interactive=False)
    runner.setup_test_environment()
    old = runner.setup_databases()
    try:
        result = runner.run_suite(suite)
    finally:
        runner.teardown_databases(old)
        runner.teardown_test_environment()
    passed = result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)
    print(
        f"upstream: {passed} passed, {len(result.failures) + len(result.errors)} failed, "
        f"{len(result.skipped)} skipped"
    )
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
