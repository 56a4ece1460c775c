"""Stand-in for sentencepiece (the sweep's assets): llama2.c's tinystories.py imports it at the top; training
from pretokenized shards never calls it."""


class SentencePieceProcessor:
    def __init__(self, model_file=None, **_):
        raise RuntimeError("sentencepiece stand-in: the sweep trains from pretokenized shards only")


class SentencePieceTrainer:
    @staticmethod
    def train(*a, **k):
        raise RuntimeError("sentencepiece stand-in: no training")
