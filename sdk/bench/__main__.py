"""`python -m worldstep.bench ...` (the same as `worldstep bench ...`)."""

import sys

from .cli import main

sys.exit(main())
