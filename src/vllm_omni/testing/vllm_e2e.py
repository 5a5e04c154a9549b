"""Small in-process ``vllm.LLM`` runs on the tiny Qwen3 model (tests, doc blocks, benchmarks).

In-process settings used throughout: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (no EngineCore or
worker subprocess), ``OMP_NUM_THREADS`` set before the engine starts, ``enforce_eager``, an
explicit ``kv_cache_memory_bytes`` (the CPU worker's free-memory check is then skipped) and
``HF_HUB_OFFLINE=1``. :func:`in_process_env` sets the environment variables (``OMP_NUM_THREADS``
only where it is unset) *before* vllm is imported; :func:`make_llm` passes ``enforce_eager`` and
``kv_cache_memory_bytes``.
"""

from __future__ import annotations

import os
from typing import Any

PROMPTS = ("Hello world", "The quick brown fox", "Speech synthesis on a CPU", "0123456789")


def in_process_env(threads: int = 1) -> None:
    """Environment for fast in-process engines; call before ``import vllm``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def make_llm(model: str, *, quantization: str | None = None, kv_bytes: int = 64 << 20, **kwargs: Any):
    from vllm import LLM

    args = dict(enforce_eager=True, kv_cache_memory_bytes=kv_bytes, max_model_len=256, dtype="float32", seed=0)
    args.update(kwargs)
    return LLM(model, quantization=quantization, **args)


def greedy(llm, prompts=PROMPTS, max_tokens: int = 16) -> list[list[int]]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(list(prompts), sp, use_tqdm=False)]


def teacher_forced_top1(llm, prompts=PROMPTS, continuations: list[list[int]] | None = None) -> list[list[int]]:
    """The model's top-1 token at each position of ``prompt + continuation`` (one prefill each).

    Comparing these with ``continuations`` measures agreement position by position, without
    one early difference changing every later token as in free-running generation.
    """
    from vllm import SamplingParams, TokensPrompt

    tok = llm.get_tokenizer()
    sp = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    requests, starts = [], []
    for prompt, cont in zip(prompts, continuations):
        ids = tok.encode(prompt, add_special_tokens=False)
        requests.append(TokensPrompt(prompt_token_ids=ids + list(cont)))
        starts.append(len(ids))
    out = []
    for req, start, res in zip(requests, starts, llm.generate(requests, sp, use_tqdm=False)):
        # prompt_logprobs[i] describes token i given tokens < i; the top-1 entry has rank 1.
        tops = []
        for entry in res.prompt_logprobs[start:]:
            tops.append(next(tid for tid, lp in entry.items() if lp.rank == 1))
        out.append(tops)
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two token lists agree (lists compared pairwise)."""
    total = sum(len(x) for x in a)
    if total == 0 or len(a) != len(b):
        raise ValueError("agreement needs two non-empty lists of the same shape")
    return sum(p == q for x, y in zip(a, b) for p, q in zip(x, y)) / total
