"""`python -m yolojet`: the `yolojet` command."""

import sys

from yolojet.cli import main

if __name__ == "__main__":  # not in a worker process that imports the main module again (spawn)
    sys.exit(main())
