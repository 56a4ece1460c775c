"""save_image / make_grid as torchvision writes them (a PNG of the batch's first image grid)."""
import torch
from PIL import Image


def make_grid(tensor, nrow=8, padding=2, normalize=False, **_):
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 3:
        tensor = tensor[None]
    t = tensor.detach().float()
    if normalize:
        t = (t - t.min()) / (t.max() - t.min() + 1e-5)
    return torch.cat(list(t), dim=2)


def save_image(tensor, fp, nrow=8, padding=2, normalize=False, **kwargs):
    grid = make_grid(tensor, nrow=nrow, padding=padding, normalize=normalize)
    arr = (grid.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr).save(fp, format=kwargs.get("format"))
