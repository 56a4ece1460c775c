"""Stand-in for torchvision (the sweep's assets): datasets, transforms and utils the examples use."""
from . import datasets, io, transforms, utils  # noqa: F401

__version__ = "0.0+sweep.stand.in"  # a PEP 440 version: transformers parses it
