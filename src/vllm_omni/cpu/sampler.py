"""Sampling for the talker (codebook 0) and the 15 residual codebooks.

Why two talker samplers: a generic sampler makes several passes over the full 3072-entry
vocabulary (penalty, masks, temperature, top-k, top-p, softmax), which the study measured as a
visible share of a CPU frame; the fast one does the same arithmetic in one native pass
(``vo_talker_sample``) and evaluates noise for the 50 candidates only (a PyTorch version of
the same pass stands in where the native library cannot be built). Both use the same
counter-based noise and choose by Gumbel-max, so they pick identical ids.

Talker defaults (reference ``generate``): temperature 0.9, top-k 50, top-p 1.0, repetition
penalty 1.05 over the previously generated codec ids (HF semantics: logit / penalty if > 0,
else logit * penalty), ids 2048..3071 suppressed except EOS 2150, and EOS also suppressed for
the first ``min_new_tokens`` = 2 steps.

The random draw of talker step ``n`` is ``q = -log u ~ Exp(1)`` over the whole vocabulary, with
``u`` the counter-based uniforms of key ``frame_noise_key(seed, n)`` at indices
``TALKER_NOISE_BASE + id`` (apart from the residual codebooks' indices); the choice is
``argmax(logit / T - log q)`` over the surviving ids, which is a draw from
``softmax(logit / T)`` restricted to them (Gumbel-max; ``-log q`` is Gumbel noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vllm_omni.cpu.checks import whole_number
from vllm_omni.models.spec import ModelSpec

NEG_INF = float("-inf")


# --- residual codebooks (inside the predictor loop) --------------------------------------------

def draw_uniforms(generator: torch.Generator, groups: int = 15, size: int = 2048) -> Tensor:
    """The uniforms of one predictor frame, [groups, size], from ``generator``."""
    return torch.rand(groups, size, generator=generator)


# Counter-based noise: the uniform of (key, index) is a pure function, so a kernel can compute it
# for the 50 top-k ids only instead of drawing all 15 x 2048 uniforms per frame. The function is
# splitmix64's finaliser over ``key + (index + 1) * golden``; the top 23 bits give
# ``(2m + 1) / 2**24``, exactly representable in float32 and never 0 or 1. The native kernel
# (csrc/vo_kernels.cpp, ``counter_uniform``) computes the same bits; tests check they agree.
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_U64 = (1 << 64) - 1


def frame_noise_key(seed: int, frame: int) -> int:
    """The noise key of frame ``frame`` of a run seeded with ``seed`` (a uint64)."""
    return ((seed & 0xFFFFFFFF) << 32 | (frame & 0xFFFFFFFF)) & _U64


TALKER_NOISE_BASE = 1 << 40
"""Index of the talker's noise for vocabulary id 0 (the residual codebooks use 0 .. 15 * 2048)."""


def counter_uniforms(key: int, groups: int = 15, size: int = 2048, base: int = 0) -> Tensor:
    """The uniforms [groups, size] that noise key ``key`` stands for (index = base + group * size + id)."""
    if not 0 <= key <= _U64:
        raise ValueError(f"noise key must be a uint64, got {key}")
    with np.errstate(over="ignore"):
        index = np.arange(groups * size, dtype=np.uint64) + np.uint64(base) + np.uint64(1)
        z = np.uint64(key) + index * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z ^= z >> np.uint64(31)
    u = ((z >> np.uint64(41)).astype(np.float64) * 2 + 1) / float(1 << 24)
    return torch.from_numpy(u.astype(np.float32).reshape(groups, size))


def check_sampling(temperature: float, top_k: int, ids: int) -> None:
    """Refuse, naming the setting, what no sampler here can honour: a temperature that is not a
    finite number > 0, or a top-k outside 1..``ids`` (the candidates: a codebook or the talker's
    vocabulary). Without this the native and PyTorch paths would each fail, or not, their own way."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        t = math.nan
    if isinstance(temperature, bool) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    whole_number("top_k", top_k, 1, ids)


def residual_choice(logits: Tensor, *, greedy: bool, temperature: float = 0.9, top_k: int = 50,
                    uniforms: Tensor | None = None) -> int:
    """One residual code: argmax, or Gumbel-max over the top-k of ``logits / temperature``.

    The Gumbel noise is ``-log(-log(u))`` with ``u = uniforms[id]`` indexed by vocabulary id,
    so the choice does not depend on how ties inside top-k are ordered.
    """
    if greedy:
        return int(torch.argmax(logits))
    check_sampling(temperature, top_k, logits.numel())
    vals, idx = torch.topk(logits / temperature, top_k)
    g = -torch.log(-torch.log(uniforms[idx]))
    return int(idx[torch.argmax(vals + g)])


# --- talker (codebook 0) -----------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerConfig:
    """The talker's sampling settings; defaults are the reference ``generate`` defaults."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    min_new_tokens: int = 2
    vocab: int = 3072
    codebook_size: int = 2048
    eos_id: int = 2150

    def __post_init__(self) -> None:
        if not 1 <= self.codebook_size <= self.vocab:
            raise ValueError(f"codebook_size must be in 1..vocab ({self.vocab}), got {self.codebook_size}")
        if not 0 <= self.eos_id < self.vocab:
            raise ValueError(f"eos_id must be in 0..{self.vocab - 1}, got {self.eos_id}")
        check_sampling(self.temperature, self.top_k, self.vocab)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")

    @classmethod
    def for_model(cls, spec: ModelSpec, **kw) -> "SamplerConfig":
        return cls(vocab=spec.codec_vocab, codebook_size=spec.codebook_size, eos_id=spec.eos_id, **kw)

    def suppressed_ids(self) -> Tensor:
        """Ids 2048..3071 except EOS: never sampled as codebook 0."""
        ids = torch.arange(self.codebook_size, self.vocab)
        return ids[ids != self.eos_id]


class _TalkerSampler:
    """Seeded state shared by both talker samplers: seed, history (the step count is its length)."""

    def __init__(self, config: SamplerConfig | None = None, seed: int = 0):
        self.config = config or SamplerConfig()
        self._suppressed = self.config.suppressed_ids()
        self.reset(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.seed = seed
        self.history: list[int] = []
        # The distinct ids sampled so far, in order: a Python set to test, and the first
        # _n_seen entries of a fixed int64 buffer for the penalty. Recording a step is then
        # plain Python and one numpy store; with torch ops for it (an index test, a store and a
        # cat), recording took about 0.13 ms of a 2-thread int4 frame, run as it is right after
        # the talker step has streamed its weights through the caches.
        self._seen: set[int] = set()
        self._seen_np = np.zeros(self.config.vocab, dtype=np.int64)
        self._seen_buf = torch.from_numpy(self._seen_np)
        self._n_seen = 0

    @property
    def noise_key(self) -> int:
        """The counter-based noise key of the coming step."""
        return frame_noise_key(self.seed, len(self.history))

    def draw(self) -> Tensor:
        """The step's noise: Exp(1) over the whole vocabulary (same draw in both samplers)."""
        u = counter_uniforms(self.noise_key, 1, self.config.vocab, base=TALKER_NOISE_BASE)[0]
        return -torch.log(u)

    @property
    def _seen_ids(self) -> Tensor:
        """The distinct ids sampled so far, in the order first sampled (a view)."""
        return self._seen_buf[: self._n_seen]

    def _record(self, token: int) -> int:
        self.history.append(token)
        if token not in self._seen:
            self._seen.add(token)
            self._seen_np[self._n_seen] = token
            self._n_seen += 1
        return token

    def sample(self, logits: Tensor) -> int:
        raise NotImplementedError

    def greedy(self, logits: Tensor) -> int:
        """The official greedy choice (``do_sample=False``): the repetition penalty, the suppressed
        ids and the early-EOS ban still apply; temperature, top-k and top-p do not; then argmax."""
        scores = logits.float().clone()
        self._process(scores)
        return self._record(int(torch.argmax(scores)))

    def _process(self, scores: Tensor) -> None:
        """The processors before any warper, in place: repetition penalty (HF semantics) over the ids
        sampled so far, the suppressed ids, and EOS while fewer than min_new_tokens were sampled."""
        cfg = self.config
        ids = self._seen_ids
        if ids.numel():
            s = scores[ids]
            scores[ids] = torch.where(s < 0, s * cfg.repetition_penalty, s / cfg.repetition_penalty)
        scores.index_fill_(0, self._suppressed, NEG_INF)
        if len(self.history) < cfg.min_new_tokens:
            scores[cfg.eos_id] = NEG_INF


class EagerSampler(_TalkerSampler):
    """A generic sampler: each processor is its own pass over the full vocabulary."""

    def sample(self, logits: Tensor) -> int:
        cfg = self.config
        q = self.draw()
        scores = logits.float().clone()
        if self.history:  # repetition penalty (HF RepetitionPenaltyLogitsProcessor)
            ids = torch.tensor(self.history, dtype=torch.int64)
            s = torch.gather(scores, 0, ids)
            s = torch.where(s < 0, s * cfg.repetition_penalty, s / cfg.repetition_penalty)
            scores = scores.scatter(0, ids, s)
        mask = torch.zeros(cfg.vocab, dtype=torch.bool)
        mask[cfg.codebook_size:] = True
        mask[cfg.eos_id] = len(self.history) < cfg.min_new_tokens
        scores = scores.masked_fill(mask, NEG_INF)
        scores = scores / cfg.temperature
        if cfg.top_k > 0:  # HF TopKLogitsWarper: drop everything below the k-th value
            kth = torch.topk(scores, min(cfg.top_k, cfg.vocab)).values[-1]
            scores = scores.masked_fill(scores < kth, NEG_INF)
        # top-p (a no-op at 1.0, but a generic sampler still sorts and normalises)
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = torch.softmax(sorted_scores, -1).cumsum(-1)
        drop_sorted = cum <= (1 - cfg.top_p)
        drop_sorted[-1] = False
        scores = scores.masked_fill(drop_sorted.scatter(0, order, drop_sorted), NEG_INF)
        return self._record(int(torch.argmax(scores - torch.log(q))))


class FastSampler(_TalkerSampler):
    """One pass: the native ``vo_talker_sample`` when the library builds here, else the same
    arithmetic as PyTorch index ops on a preallocated buffer; top-k candidates only."""

    def __init__(self, config: SamplerConfig | None = None, seed: int = 0, native: bool | None = None):
        super().__init__(config, seed)
        self._buf = torch.empty(2 * self.config.vocab)
        if native:  # asked for by name: a failed build says why
            from vllm_omni.cpu import native as native_lib

            self._lib = native_lib.load()
        else:
            self._lib = _native_lib() if native is None else None

    def sample(self, logits: Tensor) -> int:
        return self._record(self._sample_native(logits) if self._lib is not None else self._sample_torch(logits))

    def _sample_native(self, logits: Tensor) -> int:
        cfg = self.config
        x = logits if logits.dtype == torch.float32 and logits.is_contiguous() else logits.float().contiguous()
        token = self._lib.vo_talker_sample(
            x.data_ptr(), cfg.vocab, self._seen_buf.data_ptr() if self._n_seen else None, self._n_seen,
            float(cfg.repetition_penalty), cfg.codebook_size, cfg.eos_id,
            int(len(self.history) < cfg.min_new_tokens), float(cfg.temperature), cfg.top_k, float(cfg.top_p),
            self.noise_key, TALKER_NOISE_BASE, self._buf.data_ptr(),
        )
        if token < 0:
            raise ValueError(f"vo_talker_sample refused logits of shape {list(logits.shape)} with {cfg}")
        return int(token)

    def _sample_torch(self, logits: Tensor) -> int:
        cfg, buf = self.config, self._buf[: self.config.vocab]
        q = self.draw()
        buf.copy_(logits)
        self._process(buf)
        vals, idx = torch.topk(buf, cfg.top_k)
        vals = vals / cfg.temperature
        if cfg.top_p < 1.0:
            vals = _top_p_sorted(vals, cfg.top_p)
        return int(idx[torch.argmax(vals - torch.log(q[idx]))])


def _native_lib():
    """The native library, or None where it cannot be built (no compiler)."""
    try:
        from vllm_omni.cpu import native

        return native.load()
    except Exception:  # noqa: BLE001 - no compiler or a failed build: the PyTorch path stands in
        return None


def _top_p_sorted(vals: Tensor, top_p: float) -> Tensor:
    """Nucleus filter on descending ``vals``: keep the smallest prefix with mass >= top_p."""
    probs = torch.softmax(vals, -1)
    before = probs.cumsum(-1) - probs  # mass strictly above each rank
    return vals.masked_fill(before >= top_p, NEG_INF)


SAMPLERS = {"eager": EagerSampler, "fast": FastSampler}


def make_sampler(kind: str = "fast", config: SamplerConfig | None = None, seed: int = 0) -> _TalkerSampler:
    try:
        return SAMPLERS[kind](config, seed)
    except KeyError:
        raise ValueError(f"unknown sampler {kind!r}; valid: {', '.join(SAMPLERS)}") from None
