"""Run an audio classifier in half precision to save memory."""

import sys

import numpy as np
import torch
from datasets import load_from_disk
from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

model_dir, data_dir = sys.argv[1], sys.argv[2]
feature_extractor = AutoFeatureExtractor.from_pretrained(model_dir)
model = AutoModelForAudioClassification.from_pretrained(model_dir)
model = model.half()
model.eval()

rows = load_from_disk(data_dir).select(range(2))
audio = [np.asarray(a, dtype=np.float32) for a in rows["audio"]]
batch = feature_extractor(audio, sampling_rate=16000, return_tensors="pt", padding=True)

with torch.no_grad():
    outputs = model(**batch)
print("logits", outputs.logits.shape)
