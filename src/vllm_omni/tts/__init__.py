"""Speech itself: an official Qwen3-TTS checkpoint in, streaming 24 kHz audio out, on the CPU.

The path of a request: ``checkpoint`` (configs checked, tokenizer, weights) -> ``prompt`` (as the
official code builds it) -> ``generate`` (fused talker and code predictor, the official sampling
rules) -> ``decoder`` (streaming code2wav) -> ``pipeline`` (chunks of audio as they are made) ->
``wav`` / the ``qwen3-tts-edge`` command (``cli``). Importing this package imports no torch.
"""
