"""`python -m gateway`: check the settings, migrate (SQLite default), load the models, serve
with uvicorn.

Settings that would make the gateway unsafe (a sample or short admin key, OIDC without
issuer or audience, a JWKS over plain http) or that it cannot serve (an S3 checkpoint bucket
without boto3) stop the start here with one line and exit status 2, before the models load.
The start line never shows a password: connection URLs are printed with it masked
(``postgresql+asyncpg://gateway:***@db/gateway``).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from typing import Any

import uvicorn
from sqlalchemy.engine import make_url

from gateway.asgi import create_app
from gateway.serving import make_oidc, make_s3_sink
from gateway.serving.auth import check_admin_key
from gateway.settings import Settings

EXIT_BAD_SETTINGS = 2
_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@]*):[^@/]*@", re.I)


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (SQLAlchemy's rendering; a regex for
    what it cannot parse), fit for a log line."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: mask user:password@ by hand
        return _USERINFO.sub(r"\g<scheme>\g<user>:***@", url)


def start_line(settings: Settings) -> str:
    """What the gateway prints when it starts (connection URLs masked)."""
    where = f"database: {masked_url(settings.database_url)}"
    if settings.redis_url:
        where += f", redis: {masked_url(settings.redis_url)}"
    return (
        f"gateway: serving on http://{settings.host}:{settings.port} "
        f"(models: {settings.models}, {where})"
    )


def check_settings(settings: Settings) -> None:
    """Raise ValueError, naming the setting, for settings the gateway refuses to start with
    (the same checks run again where the services are built)."""
    check_admin_key(settings.admin_key)
    make_oidc(settings)
    make_s3_sink(settings)


def main() -> None:
    settings = Settings.from_env()
    try:
        check_settings(settings)
    except ValueError as exc:
        print(f"gateway: refusing to start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_SETTINGS) from None
    app = create_app(settings)
    print(start_line(settings), flush=True)
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
