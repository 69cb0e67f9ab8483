"""The holder of the active bundle: atomic swaps, refusals that change nothing, versions.

Every change builds (and so validates) a complete candidate bundle first, then swaps it in
under a lock. A `PolicyError` leaves the active bundle, its revision and the
version exactly as they were. Activating content identical to the active bundle is a no-op
(`Activation.changed` is False and the version does not move).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.bundle import (
    PolicyBundle,
    PolicyError,
    Problem,
    build_bundle,
    load_bundle_dir,
    thaw,
)


@dataclass(frozen=True)
class Activation:
    """What one activation did; the caller writes it as an audit event."""

    version: int
    """The active version after this call (monotonic, +1 per content change)."""
    revision: str
    """The active revision after this call (== `after`)."""
    before: str | None
    """Revision active before this call (None for the first activation)."""
    after: str
    changed: bool
    source: str
    """What asked for it: "load_dir:<path>", "put_tenant:<id>", "remove_tenant:<id>"."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PolicyStore:
    """Holds the active `PolicyBundle`. Thread-safe; readers never see a half-built bundle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: PolicyBundle | None = None
        self._version = 0

    @classmethod
    def from_dir(cls, path: str | Path) -> PolicyStore:
        store = cls()
        store.load_dir(path)
        return store

    @property
    def active(self) -> PolicyBundle:
        """The active bundle; PolicyError if nothing was ever activated."""
        bundle = self._active
        if bundle is None:
            raise PolicyError([Problem("(store)", "(bundle)", "no policy bundle is active")])
        return bundle

    @property
    def version(self) -> int:
        return self._version

    def load_dir(self, path: str | Path) -> Activation:
        """Replace the whole bundle with the directory's documents."""
        return self.activate(load_bundle_dir(path), f"load_dir:{path}")

    def put_tenant(self, tenant_id: str, doc: Mapping[str, Any]) -> Activation:
        """Create or replace one tenant's document (the whole document, not a patch)."""
        with self._lock:
            base = self.active
            tenants: dict[str, object] = {t: thaw(d) for t, d in base.tenants.items()}
            tenants[tenant_id] = thaw(doc)
            candidate = build_bundle(thaw(base.default), tenants)
            return self._swap(candidate, f"put_tenant:{tenant_id}")

    def remove_tenant(self, tenant_id: str) -> Activation:
        """Drop one tenant's document; the tenant falls back to the default."""
        with self._lock:
            base = self.active
            tenants = {t: thaw(d) for t, d in base.tenants.items() if t != tenant_id}
            candidate = build_bundle(thaw(base.default), tenants)
            return self._swap(candidate, f"remove_tenant:{tenant_id}")

    def activate(self, candidate: PolicyBundle, source: str = "activate") -> Activation:
        """Make a bundle built elsewhere (`build_bundle`, `load_bundle_dir`) the active one,
        e.g. after evaluating it with `decide` as a dry run."""
        with self._lock:
            return self._swap(candidate, source)

    def _swap(self, candidate: PolicyBundle, source: str) -> Activation:
        """Lock held. The candidate is already valid; only the swap happens here."""
        before = self._active.revision if self._active is not None else None
        if before == candidate.revision:
            return Activation(self._version, before, before, before, False, source)
        version = self._version + 1
        self._active = dataclasses.replace(candidate, version=version)
        self._version = version
        return Activation(version, candidate.revision, before, candidate.revision, True, source)
