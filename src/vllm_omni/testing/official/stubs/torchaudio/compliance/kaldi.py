"""Part of the torchaudio stand-in: every attribute raises (see ``torchaudio/__init__.py``)."""


def __getattr__(name):
    raise RuntimeError(f"torchaudio.compliance.kaldi.{name}: torchaudio is a stub in this environment")
