"""Fixtures the tests moved here from the conformance suite share with it."""

from tests.conformance.test_store import app_store  # noqa: F401 - a fixture
from tests.conformance.test_worker import log_events  # noqa: F401 - a fixture
