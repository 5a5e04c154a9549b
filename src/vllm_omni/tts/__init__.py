"""Speech itself: an official Qwen3-TTS checkpoint in, streaming 24 kHz audio out, on the CPU.

The path of a request: ``checkpoint`` (configs checked, tokenizer, weights) -> ``prompt`` (as the
official code builds it) -> ``generate`` (fused talker and code predictor, the official sampling
rules) -> ``decoder`` (streaming code2wav) -> ``pipeline`` (chunks of audio as they are made) ->
``wav`` / the ``qwen3-tts-edge`` command (``cli``). A Base checkpoint speaks in a cloned voice:
``reference_audio`` (24 kHz mono) -> ``speaker_encoder`` and ``speech_encoder`` -> ``voice`` (kept as
a file) -> ``voice_prompt``. Importing this package imports no torch.
"""
