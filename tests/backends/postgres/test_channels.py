"""The NOTIFY channel names: identical in every process, never longer than 63 bytes.

Pure: no server. The cross-process wake-ups they carry are tested in
tests/processes (an enqueue, a forced cancel) with a schema too long to fit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaren_jobs.backends.postgres.channels import (
    cancel_channel,
    channel_name,
    settled_channel,
)

SCHEMAS = ["public", "t" * 52, "tenant_" + "x" * 56, "ünïcödé_" * 7, 'odd "quoted" name']


def all_channels(schema: str) -> list[str]:
    channel = channel_name(schema)
    return [channel, settled_channel(channel), cancel_channel(channel)]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_channel_fits_an_identifier_and_the_three_differ(schema: str) -> None:
    names = all_channels(schema)
    assert all(len(name.encode()) <= 63 for name in names), names
    assert len(set(names)) == 3


def test_a_name_that_fits_keeps_the_form_earlier_releases_listen_on() -> None:
    assert all_channels("public") == [
        "jaren_jobs.public",
        "jaren_jobs.public.settled",
        "jaren_jobs.public.cancel",
    ]


def test_long_schemas_that_share_a_prefix_get_different_channels() -> None:
    first, second = "tenant_" + "x" * 56 + "a", "tenant_" + "x" * 56 + "b"
    assert set(all_channels(first)).isdisjoint(all_channels(second))


def test_another_process_with_another_hash_seed_derives_the_same_channels() -> None:
    program = (
        "import json, sys\n"
        "from jaren_jobs.backends.postgres.channels import *\n"
        "out = []\n"
        "for schema in json.loads(sys.argv[1]):\n"
        "    c = channel_name(schema)\n"
        "    out.append([c, settled_channel(c), cancel_channel(c)])\n"
        "print(json.dumps(out))\n"
    )
    import json

    mine = [all_channels(schema) for schema in SCHEMAS]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        answer = subprocess.run(
            [sys.executable, "-c", program, json.dumps(SCHEMAS)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(answer.stdout) == mine
