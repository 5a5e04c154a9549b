"""Part of the torchaudio stand-in (see ``torchaudio/__init__.py``)."""
