"""Mixture policies used by cluster tests: a module of its own, which the tests list in
``mdata.planner.trusted-modules`` so that the scheduler (in the test process) may import it."""

from __future__ import annotations

from mdata.mixing import MetricMixturePolicy


class FollowTheLoss(MetricMixturePolicy):
    """Weights proportional to the last reported loss per source (start: equal weights)."""

    def __init__(self, names):
        super().__init__({n: 1.0 for n in names})
        self.names = list(names)

    def weights(self, step, metrics_history=(), **kwargs):
        if not metrics_history:
            return dict(self.initial_weights)
        last = metrics_history[-1].metrics
        return {n: float(last.get(f"loss/{n}", 0.0)) for n in self.names}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass
