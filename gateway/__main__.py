"""`python -m gateway`: migrate (SQLite default), load the models, serve with uvicorn."""

from __future__ import annotations

import uvicorn

from gateway.asgi import create_app
from gateway.settings import Settings


def main() -> None:
    settings = Settings.from_env()
    app = create_app(settings)
    print(
        f"gateway: serving on http://{settings.host}:{settings.port} "
        f"(models: {settings.models}, database: {settings.database_url})",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
