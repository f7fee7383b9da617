"""`python -m yolojet`: the `yolojet` command."""

import sys

from yolojet.cli import main

sys.exit(main())
