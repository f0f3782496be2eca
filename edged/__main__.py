"""`python -m edged` is the same as the `edged` console script."""

import sys

from edged.cli import main

sys.exit(main())
