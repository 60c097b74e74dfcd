"""``python -m jaren_jobs``: the command line."""

from jaren_jobs.cli import main

raise SystemExit(main())
