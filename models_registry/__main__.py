"""``python -m models_registry``: the admin API client (see models_registry.cli)."""

from models_registry.cli import main

raise SystemExit(main())
