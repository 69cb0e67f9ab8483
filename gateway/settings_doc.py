"""The settings table of docs/configuration.md, generated from gateway/settings.py: one row
per ``Settings`` field (its environment variable, its default, its docstring).

    python -m gateway.settings_doc            # rewrite the table between the markers
    python -m gateway.settings_doc --check    # exit 1 when the page differs from it

A docstring is written for the page: Markdown, with ``code`` as in the rest of the source
(rendered `code`) and links relative to docs/. tests/unit/test_settings_doc.py fails when
the page and the docstrings disagree.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import fields
from pathlib import Path

from gateway.settings import ROOT, Settings

SOURCE = Path(__file__).with_name("settings.py")
PAGE = ROOT / "docs" / "configuration.md"
BEGIN = "<!-- generated from gateway/settings.py by python -m gateway.settings_doc -->"
END = "<!-- end of the settings table -->"


def docstrings(source: str) -> dict[str, str]:
    """Each field of ``class Settings`` in ``source`` with the string literal under it;
    ValueError naming a field that has none."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == Settings.__name__)
    found: dict[str, str] = {}
    missing: list[str] = []
    for stmt, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        value = after.value if isinstance(after, ast.Expr) else None
        doc = value.value if isinstance(value, ast.Constant) else None
        if isinstance(doc, str) and doc.strip():
            found[stmt.target.id] = doc
        else:
            missing.append(stmt.target.id)
    if missing:
        raise ValueError(f"settings without a docstring: {', '.join(missing)}")
    return found


def _default(value: object) -> str:
    """A default as the page shows it: machine-independent (the checkout is ``<repo>``)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, int):
        return f"`{value}`"
    return f"`{str(value).replace(str(ROOT), '<repo>')}`"


def _cell(doc: str) -> str:
    """A docstring as one table cell: one line, ``code`` as `code`, pipes escaped."""
    text = " ".join(doc.split()).replace("``", "`")
    return text.replace("|", "\\|")


def settings_table(source: str | None = None) -> str:
    """The Markdown table of every setting (``source``: settings.py's text, default the
    file's)."""
    docs = docstrings(SOURCE.read_text() if source is None else source)
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        if f.name not in docs:
            raise ValueError(f"setting {f.name} has no docstring in the source")
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        rows.append(f"| `GATEWAY_{f.name.upper()}` | {_default(default)} | {_cell(docs[f.name])} |")
    return "\n".join(rows) + "\n"


def with_table(page: str, table: str) -> str:
    """``page`` with ``table`` between the markers; ValueError when they are missing."""
    head, begin, rest = page.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{PAGE.name} lacks the settings table's markers")
    return head + begin + table + end + tail


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    wanted = with_table(page, settings_table())
    if "--check" in argv:
        if wanted != page:
            print(f"{PAGE} differs from the settings' docstrings: python -m gateway.settings_doc")
            return 1
        return 0
    if wanted != page:
        PAGE.write_text(wanted)
        print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
