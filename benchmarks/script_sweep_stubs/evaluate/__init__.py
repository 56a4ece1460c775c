"""Stand-in for `evaluate` (the sweep's assets): load(name) gives a metric computed with numpy."""
import numpy as np

__version__ = "0.0-sweep-stand-in"


class _Metric:
    def __init__(self, name):
        self.name, self._p, self._r = name, [], []

    def add_batch(self, predictions=None, references=None):
        self._p.extend(np.asarray(predictions).reshape(-1).tolist())
        self._r.extend(np.asarray(references).reshape(-1).tolist())

    def compute(self, predictions=None, references=None, **_):
        if predictions is not None:
            self.add_batch(predictions, references)
        p, r = np.asarray(self._p), np.asarray(self._r)
        self._p, self._r = [], []
        acc = float((p == r).mean()) if len(p) else 0.0
        return {"accuracy": acc, "f1": acc}


def load(name, *args, **kwargs):
    return _Metric(name)
