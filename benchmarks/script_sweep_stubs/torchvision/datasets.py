"""Small generated datasets in torchvision's shapes: MNIST (28x28 L images, int labels), FakeData,
ImageFolder, CIFAR10. Sizes come from SWEEP_DATASET_SIZE (default 64 train, 32 test)."""
import os

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset


def _n(train):
    n = int(os.environ.get("SWEEP_DATASET_SIZE", "64"))
    return n if train else max(n // 2, 8)


class _Generated(Dataset):
    mode, size, classes_n = "L", (28, 28), 10

    def __init__(self, root=None, train=True, download=False, transform=None, target_transform=None, **_):
        self.transform, self.target_transform = transform, target_transform
        rng = np.random.default_rng(0 if train else 1)
        shape = self.size if self.mode == "L" else (*self.size, 3)
        self.data = torch.from_numpy(rng.integers(0, 255, (_n(train), *shape), dtype=np.uint8))
        self.targets = torch.from_numpy(rng.integers(0, self.classes_n, _n(train)))  # int64, as torchvision's
        self.classes = [str(i) for i in range(self.classes_n)]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        img, target = Image.fromarray(self.data[i].numpy(), mode=self.mode), int(self.targets[i])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class MNIST(_Generated):
    pass


FashionMNIST = MNIST


class CIFAR10(_Generated):
    mode, size = "RGB", (32, 32)


class FakeData(_Generated):
    mode = "RGB"

    def __init__(self, size=1000, image_size=(3, 224, 224), num_classes=10, transform=None, target_transform=None,
                 random_offset=0):
        self.size = tuple(image_size[1:])
        self.classes_n = num_classes
        super().__init__(train=True, transform=transform, target_transform=target_transform)


class ImageFolder(Dataset):
    def __init__(self, root, transform=None, target_transform=None, **_):
        self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.targets = [t for _, t in self.samples]
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        img = Image.open(path).convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target
