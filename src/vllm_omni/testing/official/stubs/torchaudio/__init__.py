"""A stand-in for torchaudio in the official implementation's test environment.

``qwen-tts`` imports ``torchaudio.compliance.kaldi`` at import time for its 25 Hz tokenizer only,
and torchaudio has no build for the torch used here. The 12 Hz checkpoints compared in the tests
never call it; anything that does gets an error instead of a silent result.
"""


def __getattr__(name):
    raise RuntimeError(f"torchaudio.{name}: torchaudio is a stub in this environment (12 Hz checkpoints only)")
