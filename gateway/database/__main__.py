"""``python -m gateway.database``: the auditor CLI (see :mod:`gateway.database.cli`)."""

import sys

from gateway.database.cli import main

sys.exit(main())
