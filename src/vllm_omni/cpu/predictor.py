"""The fused code predictor: one native call runs the 15 passes of a frame.

``FusedPredictor(weights, fmt)`` packs the predictor's weights once (merged QKV, merged
gate/up, ``fmt`` = fp32, int8 or int4, see ``vllm_omni.cpu.quant``), preallocates a static
16-slot KV cache and every buffer, and runs a whole frame -- 2-token prefill, 14 one-token
passes, 15 heads, sampling (greedy, or top-k Gumbel-max from caller-provided uniforms or from
the counter-based uniforms of a noise key, evaluated in the kernel for the top-k ids only) and
the embedding sum -- inside one OpenMP parallel region of ``csrc/vo_kernels.cpp``.

Semantics are those of ``vllm_omni.cpu.reference.ReferencePredictor``; the tests compare the
two. ``NativeStack`` (the packed decoder stack with its cache) is shared with the fused talker.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from vllm_omni.cpu import native
from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.hugepages import into_huge_arena
from vllm_omni.cpu.quant import Packer, QuantMatrix, check_format, pack_now
from vllm_omni.cpu.reference import rope_tables
from vllm_omni.cpu.sampler import check_sampling
from vllm_omni.cpu.weights import BlockWeights, PredictorWeights
from vllm_omni.models.spec import StackSpec
from vllm_omni.results.provenance import usable_cpus


def default_threads() -> int:
    return usable_cpus()


def vo_mat(m: QuantMatrix) -> native.VoMat:
    return native.VoMat(m.data.data_ptr(), 0 if m.scale is None else m.scale.data_ptr(), m.rows, m.cols)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


KV_CACHE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


class NativeStack:
    """A decoder stack packed for the native kernels, with its KV cache (fp32 or fp16) and workspace."""

    def __init__(self, layers: list[BlockWeights], norm: Tensor, stack: StackSpec, fmt: str, threads: int | None,
                 max_positions: int, extra_len: int = 0, variant: str = "native", kv_cache: str = "fp32",
                 packer: Packer = pack_now, name: str = "stack"):
        if kv_cache not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache!r}")
        self.fmt, self.stack, self.max_positions = check_format(fmt), stack, whole_number("max_positions", max_positions)
        self.kv_cache = kv_cache
        self.lib = native.load(variant)
        self.threads = default_threads() if threads is None else whole_number("threads", threads)
        s = stack
        self._keep: list[object] = []
        self.k_cache, self.v_cache = [], []
        self.c_layers = (native.VoLayer * len(layers))()
        self.bytes = 0
        packed = []
        for i, w in enumerate(layers):
            # the fp32 matrices are made only when the packer needs them (lazy weights stay unread)
            def pack(part: str, make) -> QuantMatrix:
                return packer(f"{name}.{i}.{part}", fmt, make)

            packed += [
                pack("qkv", lambda: torch.cat([w.q_proj, w.k_proj, w.v_proj])), pack("o", lambda: w.o_proj),
                pack("gate_up", lambda: torch.cat([w.gate_proj, w.up_proj])), pack("down", lambda: w.down_proj),
                w.input_norm.float(), w.post_norm.float(), w.q_norm.float(), w.k_norm.float(),
            ]
        packed.append(norm.float())
        # one huge-page arena for every weight the stack streams (see vllm_omni.cpu.hugepages)
        self._arena, packed, self.huge_page_bytes = into_huge_arena(packed)
        self.norm = packed.pop()
        for i in range(len(layers)):
            qkv, o, gu, down, *norms = packed[8 * i: 8 * i + 8]
            kc = torch.zeros(s.kv_heads, max_positions, s.head_dim, dtype=KV_CACHE_DTYPES[kv_cache])
            vc = torch.zeros_like(kc)
            self.k_cache.append(kc)
            self.v_cache.append(vc)
            self._keep += [qkv, o, gu, down, norms]
            self.bytes += sum(m.nbytes for m in (qkv, o, gu, down)) + sum(n.numel() * 4 for n in norms)
            self.c_layers[i] = native.VoLayer(
                norms[0].data_ptr(), norms[1].data_ptr(), norms[2].data_ptr(), norms[3].data_ptr(),
                vo_mat(qkv), vo_mat(o), vo_mat(gu), vo_mat(down), kc.data_ptr(), vc.data_ptr(),
            )
        self.bytes += self.norm.numel() * 4
        cos, sin = rope_tables(torch.arange(max_positions), s.head_dim, s.rope_theta, torch.float32)
        self.rope_cos = cos[:, : s.head_dim // 2].contiguous()
        self.rope_sin = sin[:, : s.head_dim // 2].contiguous()
        self.c = native.VoStack(
            native.FMT_CODES[fmt], len(layers), s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim,
            max_positions, self.threads, s.rms_eps, int(kv_cache == "fp16"), self.c_layers, self.norm.data_ptr(),
            self.rope_cos.data_ptr(), self.rope_sin.data_ptr(), None, 0,
        )
        self.extra_len = int(extra_len)
        self.workspace = None
        self._fit_workspace()

    def _fit_workspace(self) -> None:
        """Make the workspace at least as large as the kernels need at the current thread count.

        Each thread keeps its own copy of every GEMV's input there, so more threads need more
        bytes; the workspace holds nothing between calls, so it is simply replaced.
        """
        nbytes = self.lib.vo_workspace_bytes(ctypes.byref(self.c), self.extra_len)
        if self.workspace is not None and nbytes <= self.c.ws_bytes:
            return
        self.workspace = torch.empty(nbytes + 64, dtype=torch.uint8)
        addr = self.workspace.data_ptr()
        self.c.ws = (addr + 63) // 64 * 64
        self.c.ws_bytes = nbytes

    def set_threads(self, threads: int) -> None:
        self.threads = self.c.threads = int(threads)
        self._fit_workspace()

    def forward(self, x: Tensor, pos0: int, head: QuantMatrix | None = None) -> tuple[Tensor, Tensor | None]:
        """Run ``x`` [T, H] (T <= ``lib.vo_max_tokens()``) at positions pos0..; (final-normed hidden [T, H],
        logits of the last or None)."""
        x = x.float().contiguous()
        t = x.shape[0]
        out = torch.empty(t, self.stack.hidden)
        logits = None if head is None else torch.empty(head.rows)
        self.forward_into(x.data_ptr(), t, pos0, out.data_ptr(), None if head is None else vo_mat(head), _ptr(logits))
        return out, logits

    def forward_into(self, x: int, t: int, pos0: int, out: int, head: native.VoMat | None, logits: int | None) -> None:
        """``forward`` on raw pointers into caller-owned buffers, for loops that allocate nothing per call."""
        hm = None if head is None else ctypes.byref(head)
        rc = self.lib.vo_stack_forward(ctypes.byref(self.c), x, t, int(pos0), out, hm, logits)
        if rc != 0:
            raise RuntimeError(f"vo_stack_forward failed ({rc}): T={t}, pos0={pos0}, max_positions={self.max_positions}")

    def new_cache(self) -> tuple[list[Tensor], list[Tensor]]:
        """Another stream's KV cache for this stack (keys, values per layer), for ``forward_rows``.

        Left uninitialised: a row reads only the positions up to its own, which its stream has
        written, so a cache is reused without clearing, and the memory of positions never
        reached is never touched (a 2048-position fp16 cache of the 0.6B talker is 235 MB)."""
        keys = [torch.empty_like(k) for k in self.k_cache]
        return keys, [torch.empty_like(k) for k in keys]

    def forward_rows(self, x: Tensor, positions: list[int], caches: list[tuple[list[Tensor], list[Tensor]]],
                     head: QuantMatrix | None = None, head_rows: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Rows of several streams in one call, each weight tile read once for all of them: row t of
        ``x`` [T, H] at ``positions[t]`` of ``caches[t]`` (``new_cache``, or the stack's own
        ``(k_cache, v_cache)``); rows that share a cache come in order of position. Returns the
        final-normed hidden states [T, H] and, with ``head``, the logits [L, head.rows] of the last
        L = ``head_rows`` rows (default: every row)."""
        x = x.float().contiguous()
        t = x.shape[0]
        if len(positions) != t or len(caches) != t:
            raise ValueError(f"{t} rows need {t} positions and {t} caches, got {len(positions)} and {len(caches)}")
        kv = self.kv_pointers(caches, "row")
        last = t if head_rows is None else whole_number("head_rows", head_rows, 1, t)
        pos = (ctypes.c_int32 * t)(*positions)
        out = torch.empty(t, self.stack.hidden)
        logits = None if head is None else torch.empty(last, head.rows)
        hm = None if head is None else ctypes.byref(vo_mat(head))
        rc = self.lib.vo_stack_forward_rows(ctypes.byref(self.c), x.data_ptr(), t, ctypes.addressof(pos),
                                            ctypes.addressof(kv), out.data_ptr(), hm, _ptr(logits), last)
        if rc != 0:
            raise RuntimeError(f"vo_stack_forward_rows failed ({rc}): T={t}, positions={list(positions)}, "
                               f"max_positions={self.max_positions}")
        return out, logits

    def kv_pointers(self, caches: list[tuple[list[Tensor], list[Tensor]]], what: str) -> ctypes.Array:
        """The native table of ``caches`` (keys then values, per entry and layer), each checked against
        the stack's own cache; ``what`` names an entry in the errors ("row", "stream")."""
        n = len(self.k_cache)
        kv = (ctypes.c_void_p * (len(caches) * n * 2))()
        for r, (keys, values) in enumerate(caches):
            if len(keys) != n or len(values) != n:
                raise ValueError(f"{what} {r}: a cache needs {n} layers of keys and values")
            for layer, (k, v) in enumerate(zip(keys, values)):
                want = self.k_cache[layer]
                if k.shape != want.shape or v.shape != want.shape or k.dtype != want.dtype or v.dtype != want.dtype:
                    raise ValueError(f"{what} {r}, layer {layer}: cache of {list(k.shape)} {k.dtype}, expected "
                                     f"{list(want.shape)} {want.dtype} (NativeStack.new_cache)")
                kv[(r * n + layer) * 2], kv[(r * n + layer) * 2 + 1] = k.data_ptr(), v.data_ptr()
        return kv

    def fill_cache(self, length: int, seed: int = 0) -> None:
        """Fill the first ``length`` cache positions with random K/V (benchmark set-up)."""
        g = torch.Generator().manual_seed(seed)
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc[:, :length] = torch.randn(kc.shape[0], length, kc.shape[2], generator=g)
            vc[:, :length] = torch.randn(vc.shape[0], length, vc.shape[2], generator=g)


class FusedPredictor:
    """The code predictor as one native call per frame (see the module doc)."""

    def __init__(self, weights: PredictorWeights, fmt: str = "fp32", threads: int | None = None,
                 variant: str = "native", packer: Packer = pack_now):
        self.spec, self.fmt = weights.spec, check_format(fmt)
        spec = weights.spec
        self.groups, self.vocab, self.ht = spec.residual_codebooks, spec.codebook_size, spec.talker.hidden
        self.native = NativeStack(weights.layers, weights.norm, spec.predictor, fmt, threads,
                                  max_positions=spec.num_code_groups, extra_len=max(3 * self.vocab, self.ht),
                                  variant=variant, packer=packer, name="predictor")
        self.lib = self.native.lib
        heads = [packer(f"predictor.head.{i}", fmt, lambda i=i: weights.lm_head[i]) for i in range(self.groups)]
        self._heads_arena, self.heads, huge = into_huge_arena(heads)
        self.native.huge_page_bytes += huge
        self.c_heads = (native.VoMat * self.groups)(*[vo_mat(h) for h in self.heads])
        self.embedding = weights.codec_embedding.float().contiguous()
        self.proj = self.proj_bias = None
        if weights.proj_weight is not None:
            self.proj = packer("predictor.proj", fmt, lambda: weights.proj_weight)
            self.proj_bias = weights.proj_bias.float().contiguous()
        self.c_proj = vo_mat(self.proj) if self.proj is not None else native.VoMat(None, None, 0, 0)
        self._codes = torch.empty(self.groups, dtype=torch.int64)
        self._sum = torch.empty(self.ht)
        self._logits = torch.empty(self.groups, self.vocab)
        self._uniforms = torch.empty(self.groups, self.vocab)
        self._pass_x = torch.zeros(spec.predictor.hidden)
        self._pass_out = torch.empty(spec.predictor.hidden)
        self._pass_logits = torch.empty(self.vocab)

    @property
    def threads(self) -> int:
        return self.native.threads

    def set_threads(self, threads: int) -> None:
        self.native.set_threads(threads)

    def frame(self, past_hidden: Tensor, c0_embed: Tensor, *, greedy: bool = True, temperature: float = 0.9,
              top_k: int = 50, uniforms: Tensor | None = None, noise_key: int | None = None,
              return_logits: bool = False):
        """(codes int64 [15], embed_sum [H_t]) -- and the 15 logit rows when ``return_logits``.

        Sampling as in the reference: argmax when ``greedy``; otherwise Gumbel-max over the
        top-k of ``logits / temperature`` with noise ``-log(-log(u))``, where ``u`` is
        ``uniforms`` ([15, 2048]) or the counter-based uniforms of ``noise_key``
        (``sampler.counter_uniforms``). Either way the kernel evaluates the noise for the
        top-k entries only.
        """
        ph = past_hidden.float().contiguous()
        c0 = c0_embed.float().contiguous()
        if ph.shape != (self.ht,) or c0.shape != (self.ht,):
            raise ValueError(f"past_hidden and c0_embed must be [{self.ht}]")
        uptr, key = None, 0
        if not greedy:
            check_sampling(temperature, top_k, self.vocab)
            if uniforms is not None:
                if uniforms.shape != (self.groups, self.vocab):
                    raise ValueError(f"uniforms must be [{self.groups}, {self.vocab}], got {list(uniforms.shape)}")
                self._uniforms.copy_(uniforms)
                uptr = self._uniforms.data_ptr()
            elif noise_key is not None:
                if not 0 <= noise_key < 1 << 64:
                    raise ValueError(f"noise_key must be a uint64, got {noise_key}")
                key = noise_key
            else:
                raise ValueError("sampling needs uniforms [15, 2048] or a noise_key")
        rc = self.lib.vo_predictor_frame(
            ctypes.byref(self.native.c), self.c_heads, self.groups, self.embedding.data_ptr(), self.ht,
            ctypes.byref(self.c_proj), _ptr(self.proj_bias), ph.data_ptr(), c0.data_ptr(), int(bool(greedy)),
            float(temperature), int(top_k), uptr, key, self._codes.data_ptr(), self._sum.data_ptr(),
            self._logits.data_ptr() if return_logits else None,
        )
        if rc != 0:
            raise RuntimeError(f"vo_predictor_frame failed ({rc})")
        out = (self._codes.clone(), self._sum.clone())
        return out + (self._logits.clone(),) if return_logits else out

    def new_cache(self) -> tuple[list[Tensor], list[Tensor]]:
        """Another stream's 16-slot cache, for ``frames``."""
        return self.native.new_cache()

    @property
    def max_streams(self) -> int:
        """Streams one ``frames`` call takes (its first pass holds two rows a stream)."""
        return int(self.lib.vo_max_streams())

    def frames(self, past_hidden: Tensor, c0_embed: Tensor, caches: list, *, greedy: bool = True,
               temperature: float = 0.9, top_k: int = 50, noise_keys: list[int] | None = None) -> tuple[Tensor, Tensor]:
        """The frames of B streams in one native call, each weight tile read once for all of them:
        (codes int64 [B, 15], embed sums [B, H_t]) from ``past_hidden`` and ``c0_embed`` [B, H_t],
        stream b in ``caches[b]`` (``new_cache``) with noise key ``noise_keys[b]`` when sampling.
        Each stream's codes are those ``frame`` gives it alone."""
        ph = past_hidden.float().contiguous()
        c0 = c0_embed.float().contiguous()
        b = ph.shape[0] if ph.ndim == 2 else 0
        if ph.shape != (b, self.ht) or c0.shape != (b, self.ht) or not 1 <= b <= self.max_streams:
            raise ValueError(f"past_hidden and c0_embed must be [B, {self.ht}] with B in 1..{self.max_streams}, "
                             f"got {list(ph.shape)} and {list(c0.shape)}")
        if len(caches) != b:
            raise ValueError(f"{b} streams need {b} caches, got {len(caches)}")
        keys = (ctypes.c_uint64 * b)()
        if not greedy:
            check_sampling(temperature, top_k, self.vocab)
            if noise_keys is None or len(noise_keys) != b:
                raise ValueError(f"sampling {b} streams needs {b} noise_keys")
            for i, key in enumerate(noise_keys):
                if not 0 <= key < 1 << 64:
                    raise ValueError(f"noise_keys[{i}] must be a uint64, got {key}")
                keys[i] = key
        kv = self.native.kv_pointers(caches, "stream")
        codes = torch.empty(b, self.groups, dtype=torch.int64)
        sums = torch.empty(b, self.ht)
        scratch = torch.empty(3 * b * self.vocab)
        rc = self.lib.vo_predictor_frames(
            ctypes.byref(self.native.c), self.c_heads, self.groups, self.embedding.data_ptr(), self.ht,
            ctypes.byref(self.c_proj), _ptr(self.proj_bias), b, ctypes.addressof(kv), ph.data_ptr(), c0.data_ptr(),
            int(bool(greedy)), float(temperature), int(top_k), None, ctypes.addressof(keys), codes.data_ptr(),
            sums.data_ptr(), None, scratch.data_ptr(),
        )
        if rc != 0:
            raise RuntimeError(f"vo_predictor_frames failed ({rc}) for {b} streams")
        return codes, sums

    def pass_once(self, x: Tensor | None = None, *, position: int = 8, head: int = 0) -> Tensor:
        """One single-token pass (5 layers, final norm, ``lm_head[head]``) at ``position``; its logits.

        For timing a single pass: the cache keeps whatever earlier frames left in it. The
        logits are a buffer the next call overwrites (clone them to keep them): the call
        allocates nothing and runs no torch operator when ``x`` is float32 and contiguous,
        because after a pass has streamed its weights through the caches every such step
        costs tens of microseconds, and that is not part of the pass.
        """
        if x is None:
            x = self._pass_x
        elif x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        if x.numel() != self._pass_x.numel():
            raise ValueError(f"x must hold {self._pass_x.numel()} values, got {tuple(x.shape)}")
        if not 0 <= head < self.groups:
            raise ValueError(f"head must be in 0..{self.groups - 1}, got {head}")
        self.native.forward_into(x.data_ptr(), 1, position, self._pass_out.data_ptr(), self.c_heads[head],
                                 self._pass_logits.data_ptr())
        return self._pass_logits

    @property
    def pass_bytes(self) -> int:
        """Weight bytes one pass reads as packed here (blocks + norm + one head)."""
        return self.native.bytes + self.heads[0].nbytes
