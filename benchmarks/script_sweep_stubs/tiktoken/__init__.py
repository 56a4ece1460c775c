"""Stand-in for tiktoken (the sweep's assets): nanoGPT's sample.py imports it at the top and uses it only when the
checkpoint has no meta.pkl; the sweep's checkpoints always have one."""


def get_encoding(name):
    raise RuntimeError("tiktoken stand-in: the sweep's nanoGPT data has its own meta.pkl")
