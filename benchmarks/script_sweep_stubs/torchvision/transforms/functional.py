"""`torchvision.transforms.functional`: the functions the examples and transformers' image_utils import."""
import torch
from PIL import Image


def to_tensor(pic):
    from . import ToTensor

    return ToTensor()(pic)


def pil_to_tensor(pic):
    from . import PILToTensor

    return PILToTensor()(pic)


def to_pil_image(t):
    arr = (t.detach().float().clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr)
