"""Stand-in for `torchcodec` (the sweep's assets): datasets 4.x decodes an Audio column with its AudioDecoder.
This one reads the PCM WAV clips the asset maker writes with the stdlib `wave` module, and gives what torchcodec
gives: float32 samples in [-1, 1], shaped (channels, samples), at the file's rate or the one asked for."""

__version__ = "0.0-sweep-stand-in"
