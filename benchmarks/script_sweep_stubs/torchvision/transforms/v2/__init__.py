"""`torchvision.transforms.v2`, which transformers imports at import time (as `tvF`): the same stand-ins."""
from .. import *  # noqa: F401,F403
from . import functional  # noqa: F401
