"""``python -m worldstep.cli``."""

import sys

from worldstep.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
