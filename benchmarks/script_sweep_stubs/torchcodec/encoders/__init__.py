"""AudioEncoder: float samples to a 16-bit PCM WAV (datasets imports it to encode an Audio column)."""
import io
import wave

import numpy as np


class AudioEncoder:
    def __init__(self, samples, *, sample_rate):
        y = np.asarray(samples, dtype=np.float32)
        self._y, self._rate = (y[None] if y.ndim == 1 else y), sample_rate

    def to_file_like(self, file_like, format="wav", num_channels=None, **_):
        with wave.open(file_like, "wb") as w:
            w.setnchannels(self._y.shape[0])
            w.setsampwidth(2)
            w.setframerate(self._rate)
            w.writeframes((np.clip(self._y.T, -1, 1) * 32767).astype("<i2").tobytes())

    def to_tensor(self, format="wav", **kw):
        import torch

        buf = io.BytesIO()
        self.to_file_like(buf, format, **kw)
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
