"""Serving speech over HTTP: ``qwen3-tts-edge serve --model DIR``.

``protocol`` is the wire format (OpenAI's ``/v1/audio/speech`` request and errors), ``engine``
the worker that owns the model and its bounded queue, ``app`` the FastAPI routes. Nothing here
is imported by ``import vllm_omni``.
"""
