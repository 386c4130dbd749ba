r"""``python -m botorch_fed.cli``: the ``botorch-fed`` command."""

import sys

from botorch_fed.cli import main

sys.exit(main())
