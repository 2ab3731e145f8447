"""``python -m rollbox``: the ``rollbox`` command, for when the console script is not on
PATH (and for tests, which run the CLI under the interpreter they run under)."""

from __future__ import annotations

import sys

from rollbox.cli import main

if __name__ == "__main__":
    sys.exit(main())
