"""AudioDecoder for PCM WAV (path, bytes or a file object), decoded with the stdlib `wave` module."""
import io
import wave
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch


@dataclass
class AudioSamples:
    data: torch.Tensor  # float32, (channels, samples)
    pts_seconds: float
    duration_seconds: float
    sample_rate: int


class AudioDecoder:
    def __init__(self, source, *, stream_index=None, sample_rate=None, num_channels=None):
        raw = source if isinstance(source, (bytes, bytearray)) else None
        if raw is None:
            raw = source.read() if hasattr(source, "read") else open(source, "rb").read()
        with wave.open(io.BytesIO(bytes(raw))) as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            frames = w.readframes(w.getnframes())
        if width != 2:
            raise ValueError("the sweep's torchcodec stand-in reads 16-bit PCM WAV only")
        y = np.frombuffer(frames, dtype="<i2").astype(np.float32).reshape(-1, channels).T / 32768.0
        if sample_rate and sample_rate != rate:  # linear resampling, as a stand-in for torchcodec's
            n = int(round(y.shape[1] * sample_rate / rate))
            grid = np.linspace(0, y.shape[1] - 1, n)
            y = np.stack([np.interp(grid, np.arange(y.shape[1]), c) for c in y]).astype(np.float32)
            rate = sample_rate
        if num_channels == 1 and y.shape[0] > 1:
            y = y.mean(0, keepdims=True)
        self._data, self._rate = torch.from_numpy(np.ascontiguousarray(y)), rate
        self.metadata = SimpleNamespace(sample_rate=rate, num_channels=y.shape[0], path=None,
                                        duration_seconds=y.shape[1] / rate)

    def get_all_samples(self) -> AudioSamples:
        return AudioSamples(self._data, 0.0, self._data.shape[1] / self._rate, self._rate)

    def get_samples_played_in_range(self, start_seconds=0.0, stop_seconds=None) -> AudioSamples:
        a = int(start_seconds * self._rate)
        b = self._data.shape[1] if stop_seconds is None else int(stop_seconds * self._rate)
        return AudioSamples(self._data[:, a:b], start_seconds, (b - a) / self._rate, self._rate)


class VideoDecoder:
    """Named by datasets' isinstance checks only: the sweep has no video."""

    def __init__(self, *_, **__):
        raise NotImplementedError("the sweep's torchcodec stand-in decodes WAV audio only")
