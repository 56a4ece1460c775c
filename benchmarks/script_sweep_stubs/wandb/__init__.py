"""Stand-in for `wandb` (the sweep's assets): imported by scripts that may log, its Table built in memory only."""

__version__ = "0.0-sweep-stand-in"


class Table:
    def __init__(self, columns=None, rows=None, data=None, **_):
        self.columns, self.data = list(columns or []), [list(r) for r in (rows or data or [])]


def init(*_, **__):
    raise RuntimeError("wandb stand-in: logging is not available in the sweep (WANDB_MODE=disabled)")


def log(*_, **__):
    pass
