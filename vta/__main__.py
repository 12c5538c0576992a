"""``python -m vta``: the same command line as the ``vta`` script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
