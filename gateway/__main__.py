"""`python -m gateway`: migrate (SQLite default), load the models, serve with uvicorn."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

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
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # a backstop: the gateway ends its requests itself after the grace (GracefulServer)
        timeout_graceful_shutdown=settings.shutdown_grace_s + 10,
    )
    GracefulServer(config, app, settings.shutdown_grace_s).run()


class GracefulServer(uvicorn.Server):
    """uvicorn, telling the gateway when a shutdown begins (SIGTERM): new requests are
    refused, those in flight get the grace (GATEWAY_SHUTDOWN_GRACE_S), then the ones still
    running are ended at their next step and recorded (``Recorder.close_open``); uvicorn
    then sees their connections close. Without this, uvicorn would wait for them first and
    only then let the app's shutdown begin."""

    def __init__(self, config: uvicorn.Config, app: Any, grace_s: float) -> None:
        super().__init__(config)
        self._app, self._grace_s = app, grace_s
        self._closing: asyncio.Task[int] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services = getattr(self._app.state, "services", None)
        if services is not None and self._closing is None:
            self._closing = asyncio.create_task(services.recorder.close_open(self._grace_s))
        await super().shutdown(sockets)


if __name__ == "__main__":
    main()
