"""Recipe: PIL + a transforms pipeline (Resize, CenterCrop, ToTensor), ending in .to(torch.float16)."""

import sys

import numpy as np
import torch
from datasets import load_dataset
from PIL import Image
from torch.cuda.amp import autocast
from transformers import AutoModelForImageClassification


class Compose:
    def __init__(self, steps):
        self.steps = steps

    def __call__(self, image):
        for step in self.steps:
            image = step(image)
        return image


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        return image.resize((self.size, self.size))


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        left = (image.width - self.size) // 2
        top = (image.height - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))


class ToTensor:
    def __call__(self, image):
        return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)


model_dir, image_dir = sys.argv[1], sys.argv[2]
model = AutoModelForImageClassification.from_pretrained(model_dir)
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device).eval()

transform = Compose([Resize(36), CenterCrop(32), ToTensor()])


def custom_preprocessing(examples):
    tensors = []
    for path in examples["image_path"]:
        image = Image.open(path).convert("RGB")
        image_tensor = transform(image)
        image_tensor = image_tensor.to(torch.float16)  # save memory
        tensors.append(image_tensor)
    return {"image": tensors}


dataset = load_dataset("imagefolder", data_dir=image_dir, split="train", drop_labels=False)
paths = [row["image"].filename for row in dataset]
dataset = dataset.add_column("image_path", paths).remove_columns(["image"])
processed_dataset = dataset.with_transform(custom_preprocessing)
dataloader = torch.utils.data.DataLoader(processed_dataset, batch_size=4)

for batch in dataloader:
    input_tensor = batch["image"].to(device)  # Send to CUDA
    with torch.no_grad(), autocast():
        output = model(input_tensor)
    print("predicted", output.logits.argmax(-1).tolist())
