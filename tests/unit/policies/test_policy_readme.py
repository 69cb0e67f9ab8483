"""Every ```yaml block in policies/README.md loads and validates; the docs match the code."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from policy_helpers import BUNDLES, README, default_doc

from policies import PolicyError, Reason, build_bundle
from policies.bundle import parse_yaml

FENCE = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)
FILE_LINE = re.compile(r"\A# file: (default\.yaml|tenants/([A-Za-z0-9_.-]+)\.yaml)\n")


def yaml_blocks() -> list[tuple[str, str]]:
    blocks = []
    for text in FENCE.findall(README.read_text()):
        match = FILE_LINE.match(text)
        assert match, f"README yaml block must start with '# file: ...':\n{text}"
        blocks.append((match.group(1), text))
    return blocks


BLOCKS = yaml_blocks()


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 5
    assert BLOCKS[0][0] == "default.yaml"


@pytest.mark.parametrize(("name", "text"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_readme_yaml_block_loads_and_validates(name: str, text: str) -> None:
    doc: Any = parse_yaml(text, name)
    if name == "default.yaml":
        bundle = build_bundle(doc, {})
    else:
        tenant = name.removeprefix("tenants/").removesuffix(".yaml")
        bundle = build_bundle(default_doc(), {tenant: doc})
        assert bundle.effective_document(tenant) != bundle.effective_document("(none)")
    assert len(bundle.revision) == 12
    shipped = BUNDLES / name
    if shipped.exists():  # the README shows shipped files verbatim
        assert doc == yaml.safe_load(shipped.read_text()), f"README differs from {shipped}"


def test_readme_block_that_is_wrong_would_fail() -> None:
    name, text = BLOCKS[1]
    with pytest.raises(PolicyError):
        build_bundle(default_doc(), {"x": parse_yaml(text + "modes: auto\n", name)})


def test_every_reason_code_is_documented() -> None:
    readme = README.read_text()
    codes = [v for k, v in vars(Reason).items() if k.isupper()]
    assert len(codes) >= 20
    missing = [c for c in codes if f"`{c}`" not in readme]
    assert not missing, missing
