"""Headless Debian Chromium driven by Playwright (never a downloaded browser): the console's
end-to-end tests. Under CI=true a missing browser fails the run instead of skipping."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1280, "height": 800}
"""A laptop screen: the console must be usable at this size."""


def require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


@contextmanager
def browser_page(profile: Path) -> Iterator[Any]:
    """A fresh-profile headless Chromium page; the page's JS errors are collected on
    ``page.errors`` (tests assert it stays empty), HTTP errors on ``page.failed_loads``."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport=VIEWPORT,
            accept_downloads=True,
        )
        try:
            page = context.new_page()
            errors: list[str] = []
            failed: list[str] = []

            def on_console(msg: Any) -> None:
                if msg.type == "error":
                    bucket = failed if msg.text.startswith("Failed to load resource") else errors
                    bucket.append(msg.text)

            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            page.on("console", on_console)
            page.errors = errors  # uncaught exceptions and console errors of the page's code
            page.failed_loads = failed  # HTTP errors answered to the page (some expected)
            yield page
        finally:
            context.close()


def screenshot(page: Any, name: str, tmp: Path, *, full_page: bool = False) -> Path:
    """Save a screenshot under ``tmp``; with CONSOLE_SCREENSHOTS=<dir> also there (how
    docs/console/*.png are made). The toast is hidden first."""
    path = tmp / f"{name}.png"
    page.evaluate("document.getElementById('toast').hidden = true")
    page.screenshot(path=str(path), full_page=full_page)
    target = os.environ.get("CONSOLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / f"{name}.png")
    return path
