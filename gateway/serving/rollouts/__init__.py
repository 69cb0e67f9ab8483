"""Draft rollouts: the view of the database's rollouts (view.py), the per-request split
and guard (traffic.py) and the admin use cases (admin.py)."""

from gateway.serving.rollouts.admin import RolloutAdmin
from gateway.serving.rollouts.traffic import RolloutTraffic
from gateway.serving.rollouts.view import RolloutView

__all__ = ["RolloutAdmin", "RolloutTraffic", "RolloutView"]
