"""GATEWAY_CPU_LINEAR pins the fp32 CPU linear forward (or leaves it to the load-time
timing), and a typo is an error at start, not a silent default."""

from __future__ import annotations

import pytest

from gateway.serving import _cpu_linear
from gateway.settings import Settings


@pytest.mark.parametrize(
    ("raw", "pinned"), [("auto", None), ("on", True), ("OFF", False), ("true", True)]
)
def test_the_setting_reaches_the_pool_as_a_pin_or_none(raw: str, pinned: bool | None) -> None:
    settings = Settings.from_env({"GATEWAY_CPU_LINEAR": raw})
    assert _cpu_linear(settings.cpu_linear) is pinned


def test_an_unknown_value_is_refused() -> None:
    with pytest.raises(ValueError, match="GATEWAY_CPU_LINEAR"):
        _cpu_linear(Settings.from_env({"GATEWAY_CPU_LINEAR": "fast"}).cpu_linear)
