"""``python -m models_registry``: the admin API client (see models_registry.cli); ``heads``
trains draft heads (models_registry.heads.cli)."""

import sys

if sys.argv[1:2] == ["heads"]:
    from models_registry.heads.cli import main as heads_main

    raise SystemExit(heads_main(sys.argv[2:]))

from models_registry.cli import main

raise SystemExit(main())
