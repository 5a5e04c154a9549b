"""llama.cpp (through llama-cpp-python's low-level API) running our random-weight GGUF files.

Why: the study's claim is a comparison with llama.cpp, so the baseline has to be llama.cpp
itself, on this host, with the same weights (``vllm_omni.engines.gguf_export``), the same
thread count and the same KV position as our kernels.

``prepare`` writes the predictor as GGUF, loads it, and decodes ``position`` tokens so that
the KV cache holds positions ``0..position-1``; each ``run_once`` then decodes one token at
``position`` (five blocks, final norm, one head: llama.cpp computes only the last token's
logits) and removes it from the cache again (``llama_memory_seq_rm``), so every timed pass
sees the same cache. Attention runs as llama.cpp runs it by default (F16 KV cache, flash
attention chosen by llama.cpp); ``kv_type="f32", flash_attn="off"`` gives the exact-fp32
path the correctness test compares with our eager reference (flash attention on the CPU
rounds through F16). Formats: ``fp32`` -> F32, ``fp16`` -> F16, ``int8`` -> Q8_0,
``int4`` -> Q4_0.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from vllm_omni.engines import EngineUnsupported
from vllm_omni.engines.gguf_export import GGUF_TYPES, GGUFFile

NAME = "llama.cpp"
FORMATS = tuple(GGUF_TYPES)
DEFAULT_TOKEN = 7
KV_TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16"}
FLASH_ATTN = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
              "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}
# ggml build options recorded in provenance (read from the installed ggml-config.cmake)
_BUILD_OPTIONS = ("GGML_NATIVE", "GGML_OPENMP", "GGML_LLAMAFILE", "GGML_CPU_REPACK", "GGML_AVX512", "GGML_AVX2",
                  "GGML_BLAS", "GGML_CPU_KLEIDIAI", "GGML_AMX_INT8")

_lib: Any = None
_log_callback: Any = None


def unavailable() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    for mod, pkg in (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")):
        if importlib.util.find_spec(mod) is None:
            return f"{pkg} is not installed (pip install -e '.[engines]')"
    return None


def _llama() -> Any:
    """llama_cpp's ctypes module, with the backend initialised and llama.cpp's log silenced."""
    global _lib, _log_callback
    if _lib is None:
        why = unavailable()
        if why:
            raise EngineUnsupported(why)
        import llama_cpp

        _log_callback = llama_cpp.llama_log_callback(lambda level, text, user: None)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _lib = llama_cpp
    return _lib


def _lib_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def ggml_commit() -> str | None:
    """ggml's build commit as the shared library reports it (``ggml_commit()``)."""
    try:
        lib = ctypes.CDLL(str(_lib_dir() / "libggml-base.so"))
        lib.ggml_commit.restype = ctypes.c_char_p
        return lib.ggml_commit().decode()
    except (OSError, AttributeError):
        return None


def build_options() -> dict[str, str]:
    """Selected ``set(GGML_...)`` values of the installed ggml-config.cmake (how ggml was built)."""
    path = _lib_dir().parent.parent / "lib" / "cmake" / "ggml" / "ggml-config.cmake"  # site-packages/lib
    try:
        text = path.read_text()
    except OSError:
        return {}
    found = dict(re.findall(r'set\((GGML_[A-Z0-9_]+) "([^"]*)"\)', text))
    return {k: found[k] for k in _BUILD_OPTIONS if k in found}


def versions() -> dict[str, str | None]:
    """llama-cpp-python's version, llama.cpp's commit (via ggml), system info and build flags."""
    if unavailable():
        return {"llama_cpp_python": None, "llama.cpp": None}
    import llama_cpp

    opts = build_options()
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "llama.cpp": ggml_commit(),
        "llama.cpp system_info": _llama().llama_print_system_info().decode().strip(),
        "llama.cpp build": " ".join(f"{k}={v}" for k, v in opts.items()) or None,
    }


def default_extra_buffers() -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (AMX, repacked layouts), as it
    does by default: not where its CPU backend reports AMX-INT8. There its AMX matrix product
    (``ggml_backend_amx_mul_mat``) crashed the process at the first int8 or int4 decode, on the
    2-core Xeon of family 6, model 167, a crash reported upstream as machine-dependent
    (ggml-org/llama.cpp#20824). Without extra buffers its weights stay in their GGUF layout."""
    return "AMX_INT8 = 1" not in _llama().llama_print_system_info().decode()


class LlamaCppModel:
    """One GGUF file loaded in one llama.cpp context (one sequence, CPU only). ``extra_buffers``:
    llama.cpp's ``use_extra_bufts``; None takes :func:`default_extra_buffers`."""

    def __init__(self, path: str | Path, *, threads: int, n_ctx: int = 512, n_batch: int | None = None,
                 kv_type: str = "f16", flash_attn: str = "auto", extra_buffers: bool | None = None):
        L = _llama()
        self.L, self.path = L, Path(path)
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if kv_type not in KV_TYPES or flash_attn not in FLASH_ATTN:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)} and flash_attn one of "
                             f"{', '.join(FLASH_ATTN)}; got {kv_type!r}, {flash_attn!r}")
        self.extra_buffers = default_extra_buffers() if extra_buffers is None else bool(extra_buffers)
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = self.extra_buffers
        self.model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self.model:
            raise EngineUnsupported(f"llama.cpp could not load {self.path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = n_batch or n_ctx
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = getattr(L, KV_TYPES[kv_type])
        cp.flash_attn_type = getattr(L, FLASH_ATTN[flash_attn])
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise EngineUnsupported(f"llama.cpp could not create a context for {self.path}")
        self.n_ctx = L.llama_n_ctx(self.ctx)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.mem = L.llama_get_memory(self.ctx)
        self.threads = threads
        self._batch_cap = int(cp.n_batch)
        self.batch = L.llama_batch_init(self._batch_cap, 0, 1)

    def set_threads(self, threads: int) -> None:
        self.L.llama_set_n_threads(self.ctx, int(threads), int(threads))
        self.threads = int(threads)

    def decode(self, tokens: list[int], pos0: int, *, all_logits: bool = False) -> None:
        """Decode ``tokens`` at positions ``pos0..``; logits of the last one (or of all)."""
        n = len(tokens)
        if not 0 < n <= self._batch_cap:
            raise ValueError(f"decode takes 1..{self._batch_cap} tokens, got {n}")
        if pos0 < 0 or pos0 + n > self.n_ctx:
            raise ValueError(f"positions {pos0}..{pos0 + n - 1} do not fit the context of {self.n_ctx}")
        b = self.batch
        b.n_tokens = n
        for i, t in enumerate(tokens):
            if not 0 <= t < self.vocab:
                raise ValueError(f"token {t} is outside the vocabulary of {self.vocab}")
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (all_logits or i == n - 1) else 0
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) for {n} tokens at position {pos0}")

    def logits(self, index: int = -1) -> Any:
        """A copy of the logits of output ``index`` (numpy float32 [vocab])."""
        import numpy as np

        ptr = self.L.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab,)).copy()

    def truncate(self, length: int) -> None:
        """Keep positions ``0..length-1`` of the KV cache, drop the rest."""
        if not self.L.llama_memory_seq_rm(self.mem, 0, int(length), -1):
            raise RuntimeError(f"llama_memory_seq_rm could not cut the cache at {length}")

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.L.llama_model_free(self.model)
            self.ctx = self.model = None

    def __del__(self) -> None:  # contexts hold hundreds of MB; free them with the object
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class LlamaCppRunner:
    """``run_once()``: one single-token decode at a fixed KV position (see the module doc)."""

    def __init__(self, gguf: GGUFFile, *, threads: int, position: int, token: int = DEFAULT_TOKEN,
                 n_ctx: int | None = None, kv_type: str = "f16", flash_attn: str = "auto"):
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.gguf, self.position, self.token = gguf, position, token
        self.model = LlamaCppModel(gguf.path, threads=threads, n_ctx=n_ctx or max(64, position + 16),
                                   kv_type=kv_type, flash_attn=flash_attn)
        self.fill(position)

    def fill(self, length: int, seed: int = 0) -> None:
        """Empty the cache, then decode ``length`` tokens (ids from ``seed``) at positions 0..length-1."""
        import random

        self.model.clear()
        rng = random.Random(seed)
        ids = [rng.randrange(self.gguf.vocab) for _ in range(length)]
        step = self.model._batch_cap
        for start in range(0, length, step):
            self.model.decode(ids[start:start + step], start)

    def set_threads(self, threads: int) -> None:
        self.model.set_threads(threads)

    def run_once(self) -> None:
        self.model.decode([self.token], self.position)
        self.model.truncate(self.position)

    def close(self) -> None:
        self.model.close()

    @property
    def bytes_per_pass(self) -> int:
        """Weight bytes one pass reads, from the GGUF tensor sizes (one embedding row)."""
        return self.gguf.token_bytes


def gguf_path(workdir: str | os.PathLike[str], name: str, fmt: str, layers: int) -> Path:
    """Where a file of this model part, format and depth goes under ``workdir``."""
    return Path(workdir) / f"{name}-{layers}l-{GGUF_TYPES[fmt].lower()}.gguf"


def prepare(weights: Any, *, fmt: str, threads: int, workdir: str | os.PathLike[str], position: int,
            head: int = 0, kv_type: str = "f16", flash_attn: str = "auto") -> LlamaCppRunner:
    """Export the predictor (``PredictorWeights``) in ``fmt`` under ``workdir`` (rewriting any
    file of the same name) and load it at ``threads`` threads, cache filled to ``position``."""
    from vllm_omni.engines.gguf_export import export_predictor

    if fmt not in GGUF_TYPES:
        raise EngineUnsupported(f"llama.cpp here runs formats {', '.join(FORMATS)}, not {fmt!r}")
    why = unavailable()
    if why:
        raise EngineUnsupported(why)
    path = gguf_path(workdir, "predictor", fmt, len(weights.layers))
    g = export_predictor(weights, path, fmt, head=head)
    return LlamaCppRunner(g, threads=threads, position=position, kv_type=kv_type, flash_attn=flash_attn)
