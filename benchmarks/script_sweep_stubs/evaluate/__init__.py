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
        (p, r), self._p, self._r = (self._p, self._r), [], []
        if self.name == "wer":  # evaluate's wer: a float, word edits over reference words
            return _wer(p, r)
        p, r = np.asarray(p), np.asarray(r)
        acc = float((p == r).mean()) if len(p) else 0.0
        return {"accuracy": acc, "f1": acc}


def _wer(predictions, references):
    edits = words = 0
    for pred, ref in zip(predictions, references):
        p, r = str(pred).split(), str(ref).split()
        row = list(range(len(p) + 1))
        for i, rw in enumerate(r, 1):
            prev, row[0] = row[0], i
            for j, pw in enumerate(p, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (rw != pw))
        edits, words = edits + row[-1], words + len(r)
    return edits / max(words, 1)


def load(name, *args, **kwargs):
    return _Metric(name)
