"""``python -m jaren_jobs``: the command line."""

from .cli import main

raise SystemExit(main())
