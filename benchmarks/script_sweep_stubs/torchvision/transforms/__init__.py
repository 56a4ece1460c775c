"""The transforms the public examples call, on PIL images, as torchvision defines them."""
from enum import Enum

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, pic):
        if isinstance(pic, torch.Tensor):
            return pic
        arr = np.asarray(pic)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        t = torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
        return t.to(torch.float32).div(255) if t.dtype == torch.uint8 else t


class PILToTensor:
    def __call__(self, pic):
        arr = np.asarray(pic)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, t):
        return t.to(self.dtype).div(255) if not t.is_floating_point() else t.to(self.dtype)


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = mean, std

    def __call__(self, t):
        mean = torch.as_tensor(self.mean, dtype=t.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=t.dtype).view(-1, 1, 1)
        return (t - mean) / std


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        return self.fn(x)


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Resize:
    def __init__(self, size, interpolation=None, antialias=None, **_):
        self.size = size

    def __call__(self, img):
        if isinstance(img, torch.Tensor):
            return torch.nn.functional.interpolate(img[None].float(), size=_size(self.size))[0].to(img.dtype)
        h, w = _size(self.size)
        return img.resize((w, h))


class CenterCrop(Resize):
    pass


class RandomResizedCrop(Resize):
    pass


class RandomCrop(Resize):
    def __init__(self, size, *a, **k):
        super().__init__(size)


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, x):
        return x


RandomVerticalFlip = RandomHorizontalFlip


class InterpolationMode(Enum):
    """torchvision's enum, every member (transformers' image_utils reads NEAREST_EXACT at import)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


from . import functional  # noqa: E402,F401 - `transforms.functional`, as torchvision has it
