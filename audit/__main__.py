"""``python -m audit`` is the same entry point as the ``dpfl-audit`` console script."""

import sys

from audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
