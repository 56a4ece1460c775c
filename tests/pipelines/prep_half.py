"""Custom image preprocessing, used with dataset.set_transform."""

import numpy as np
import torch

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(batch):
    pixel_values = []
    for image in batch["image"]:
        pixels = np.asarray(image.convert("RGB").resize((32, 32)), dtype=np.float32) / 255.0
        pixels = (pixels - MEAN) / STD
        tensor = torch.from_numpy(pixels).permute(2, 0, 1)
        pixel_values.append(tensor.to(torch.float16))  # save memory
    return {"pixel_values": pixel_values, "labels": batch["label"]}
