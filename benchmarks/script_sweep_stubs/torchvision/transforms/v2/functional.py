"""`torchvision.transforms.v2.functional`: the same functions as `transforms.functional`."""
from ..functional import *  # noqa: F401,F403
