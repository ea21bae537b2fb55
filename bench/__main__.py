"""``python -m bench``: run the benchmark (``--help`` for options)."""

from bench.harness import main

raise SystemExit(main())
