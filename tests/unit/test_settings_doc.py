"""docs/configuration.md's settings table is what gateway/settings.py's docstrings generate
(python -m gateway.settings_doc), so the page cannot drift from the settings."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gateway.settings import Settings
from gateway.settings_doc import PAGE, SOURCE, settings_table, with_table


def test_the_page_holds_the_generated_table() -> None:
    page = PAGE.read_text()
    assert with_table(page, settings_table()) == page, "run: python -m gateway.settings_doc"


def test_every_setting_has_a_row() -> None:
    table = settings_table()
    for f in fields(Settings):
        assert f"| `GATEWAY_{f.name.upper()}` |" in table


def test_a_changed_docstring_is_caught() -> None:
    """Negative control: the comparison above sees an edited docstring."""
    source = SOURCE.read_text()
    old = '"""TCP port of the HTTP server."""'
    assert source.count(old) == 1
    edited = source.replace(old, '"""The port."""')
    page = PAGE.read_text()
    assert with_table(page, settings_table(edited)) != page


def test_a_setting_without_a_docstring_is_refused() -> None:
    source = SOURCE.read_text().replace('    """TCP port of the HTTP server."""\n', "")
    with pytest.raises(ValueError, match="port"):
        settings_table(source)


def test_the_defaults_do_not_name_this_checkout() -> None:
    assert str(SOURCE.parent.parent) not in settings_table()
