"""The per-frame loop of the talker: step -> sample c0 -> predictor -> next input.

Why: a frame's cost is the sum of four different kinds of work (a 28-layer talker step, 15
predictor passes, sampling, and the bookkeeping between them), and the study's CPU split
is stated in exactly those terms. The loop accepts any talker with ``.step(x)`` and any
predictor with ``.frame(...)``, so the eager reference and the fused kernels time alike.

Per frame t (reference generate branch): the talker turns the previous frame's input into
logits and a post-norm hidden state; c0 is sampled; the predictor yields c1..c15 and the sum of
the 16 code embeddings; that sum plus a text term is the next talker input. The text term
stands in for ``trailing_text_hidden[t]`` / ``tts_pad_embed``: a fixed random vector per frame.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.sampler import frame_noise_key
from vllm_omni.cpu.weights import EMBED_STD

SYNC_ENV = "VLLM_OMNI_STEP_STATS_SYNC"
BOS_ID = 2149  # codec bos: the stand-in first input adds its embedding


class Talker(Protocol):
    def step(self, x: Tensor) -> tuple[Tensor, Tensor]: ...


class Predictor(Protocol):
    def frame(self, past_hidden: Tensor, c0_embed: Tensor, **kw: Any) -> tuple[Tensor, Tensor]: ...


class Sampler(Protocol):
    def sample(self, logits: Tensor) -> int: ...


_SYNC_ON, _SYNC_OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def sync_enabled(environ: dict[str, str] | None = None) -> bool:
    """True when ``VLLM_OMNI_STEP_STATS_SYNC`` is 1/true/yes/on, False when unset, empty or
    0/false/no/off (case-insensitive); any other value is refused, so that a typo cannot leave
    GPU timers unsynchronised while the run looks as asked."""
    raw = (os.environ if environ is None else environ).get(SYNC_ENV, "")
    value = raw.strip().lower()
    if value not in _SYNC_ON + _SYNC_OFF:
        raise ValueError(f"{SYNC_ENV}={raw!r} is not understood; set it to one of {', '.join(_SYNC_ON)} to "
                         f"synchronise the step timers, or to one of 0, false, no, off (or unset it) not to")
    return value in _SYNC_ON


def _synchronize(device: torch.device | str | None) -> None:
    """Wait for queued GPU work so a timer sees it; nothing to wait for on the CPU."""
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)


@dataclass
class StepStats:
    """Milliseconds of one frame, split the way the study splits it."""

    talker_ms: float
    predictor_ms: float
    sampler_ms: float
    bookkeeping_ms: float

    @property
    def total_ms(self) -> float:
        return self.talker_ms + self.predictor_ms + self.sampler_ms + self.bookkeeping_ms

    @classmethod
    def median(cls, stats: list["StepStats"]) -> "StepStats":
        """Component-wise median over frames (the total is then the sum of medians)."""
        if not stats:
            raise ValueError("no frames to summarise")
        return cls(*(statistics.median(getattr(s, f) for s in stats)
                     for f in ("talker_ms", "predictor_ms", "sampler_ms", "bookkeeping_ms")))


@dataclass
class FrameResult:
    codes: Tensor  # int64 [frames, 16]: c0..c15 of each frame
    stats: list[StepStats] = field(default_factory=list)
    stopped_at_eos: bool = False


class FrameLoop:
    """Runs frames through a talker, a talker sampler and a predictor, timing each part.

    ``codec_embedding`` is the talker's table [3072, H] (looked up for c0). Residual codes are
    sampled (``predictor_greedy=False``, the reference default) with counter-based noise keyed by
    ``(seed, frame)`` (``sampler.frame_noise_key``): the predictor computes the uniforms it
    needs from the key, inside its own timed region, so no per-frame draw of 15 x 2048 uniforms
    remains in the sampler's time.
    """

    def __init__(self, talker: Talker, predictor: Predictor, sampler: Sampler, codec_embedding: Tensor, *,
                 predictor_greedy: bool = False, seed: int = 0, eos_id: int = 2150,
                 device: torch.device | str | None = None, sync: bool | None = None):
        self.talker, self.predictor, self.sampler = talker, predictor, sampler
        self.codec_embedding = codec_embedding
        self.greedy, self.seed, self.eos_id, self.device = predictor_greedy, seed, eos_id, device
        self.sync = sync_enabled() if sync is None else sync

    def _now(self) -> float:
        if self.sync:
            _synchronize(self.device)
        return time.perf_counter()

    def text_terms(self, frames: int) -> Tensor:
        """The fixed random per-frame text term, [frames, H]."""
        g = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(frames, self.codec_embedding.shape[1], generator=g) * EMBED_STD

    @torch.inference_mode()
    def run(self, frames: int, *, stop_at_eos: bool = True) -> FrameResult:
        """Run up to ``frames`` frames; with ``stop_at_eos`` the EOS frame ends and is dropped."""
        text = self.text_terms(whole_number("frames", frames))
        x = self.codec_embedding[BOS_ID] + text[0]
        rows: list[Tensor] = []
        result = FrameResult(codes=torch.empty(0, 16, dtype=torch.int64))
        for t in range(frames):
            t0 = self._now()
            logits, hidden = self.talker.step(x)
            t1 = self._now()
            c0 = self.sampler.sample(logits)
            noise_key = None if self.greedy else frame_noise_key(self.seed, t)
            t2 = self._now()
            if stop_at_eos and c0 == self.eos_id:
                result.stopped_at_eos = True
                break
            c0_embed = self.codec_embedding[c0]
            t3 = self._now()
            codes, embed_sum = self.predictor.frame(hidden, c0_embed, greedy=self.greedy, noise_key=noise_key)
            t4 = self._now()
            rows.append(torch.cat([torch.tensor([c0]), codes.to(torch.int64)]))
            x = embed_sum + text[t + 1] if t + 1 < frames else embed_sum
            t5 = self._now()
            result.stats.append(StepStats(
                talker_ms=(t1 - t0) * 1e3, predictor_ms=(t4 - t3) * 1e3,
                sampler_ms=(t2 - t1) * 1e3, bookkeeping_ms=((t3 - t2) + (t5 - t4)) * 1e3,
            ))
        if rows:
            result.codes = torch.stack(rows)
        return result
