"""``python -m gateway.audit``: the auditor CLI (see :mod:`gateway.audit.cli`)."""

import sys

from gateway.audit.cli import main

sys.exit(main())
