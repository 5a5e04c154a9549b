"""Codes from a prompt: the talker and the code predictor on the fused native kernels.

The loop is the official one (``Qwen3TTSTalkerForConditionalGeneration.forward``): prefill the
prompt, sample c0; then per frame the predictor turns (talker hidden, c0) into c1..c15 and the
sum of the 16 code embeddings, that sum plus the frame's text term is the next talker input, and
the talker's step gives the next c0. EOS (2150) ends the utterance and its frame is dropped.

Sampling follows the official rules. Codebook 0: repetition penalty over the c0 ids generated
so far, ids 2048..3071 other than EOS suppressed, EOS suppressed for the first two steps; then
greedy argmax, or temperature and top-k (top-p) sampling. Residual codes: argmax, or temperature
and top-k. Sampled runs use counter-based noise keyed by the seed (``vllm_omni.cpu.sampler``),
so a seed reproduces a run on any thread count; greedy runs are the ones a test can compare
with the official code token for token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.frame import StepStats
from vllm_omni.tts.checkpoint import Checkpoint
from vllm_omni.tts.prompt import Prompt



@dataclass(frozen=True)
class Sampling:
    """The sampling settings of one request; ``from_checkpoint`` takes generation_config.json's."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_greedy: bool | None = None  # None: same as ``greedy``
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    seed: int = 0
    min_new_tokens: int = 2

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, **overrides: Any) -> "Sampling":
        g = ckpt.config.generation
        base = dict(greedy=not g.do_sample, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                    repetition_penalty=g.repetition_penalty, subtalker_greedy=not g.subtalker_dosample,
                    subtalker_temperature=g.subtalker_temperature, subtalker_top_k=g.subtalker_top_k)
        base.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("greedy") is not None and overrides.get("subtalker_greedy") is None:
            base["subtalker_greedy"] = overrides["greedy"]
        return cls(**base)


@dataclass
class GenerationStats:
    prefill_ms: float = 0.0
    prefill_positions: int = 0
    frames: list[StepStats] = field(default_factory=list)  # a frame split as the study splits one
    stopped_at_eos: bool = False


class CodeGenerator:
    """The fused talker and predictor of one checkpoint, ready to generate (weights packed once)."""

    def __init__(self, ckpt: Checkpoint, weights: str = "int4", threads: int | None = None, max_positions: int = 4096,
                 cache: bool = True):
        from vllm_omni.cpu.fused_talker import FusedTalker
        from vllm_omni.cpu.predictor import FusedPredictor
        from vllm_omni.cpu.quant import pack_now
        from vllm_omni.tts.weight_cache import CACHED_FORMATS, PackedWeights

        self.ckpt, self.weights = ckpt, weights
        self.max_positions = whole_number("max_positions", max_positions, 2)
        packer = PackedWeights.open(ckpt, weights) if cache and weights in CACHED_FORMATS else None
        self.cache = packer  # None: not cached (fp32, or asked not to)
        pack = packer or pack_now
        self.talker = FusedTalker(ckpt.talker, weights, threads, max_positions=self.max_positions, packer=pack)
        self.predictor = FusedPredictor(ckpt.predictor, weights, threads, packer=pack)
        if packer is not None:
            packer.finish()
        self.codec_embedding = ckpt.talker.codec_embedding
        self.spec = ckpt.config.spec

    @property
    def threads(self) -> int:
        return self.talker.threads

    def _sampler(self, s: Sampling):
        from vllm_omni.cpu.sampler import FastSampler, SamplerConfig

        cfg = SamplerConfig.for_model(self.spec, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                      repetition_penalty=s.repetition_penalty, min_new_tokens=s.min_new_tokens)
        return FastSampler(cfg, seed=s.seed)

    def _prefill(self, x):
        """Run the prompt through the talker from position 0; (logits, hidden) of its last position."""
        t = self.talker
        t.reset()
        n = x.shape[0]
        if n + 1 > self.max_positions:
            raise ValueError(f"the prompt has {n} positions; this generator holds {self.max_positions}")
        logits = hidden = None
        step = t.lib.vo_max_tokens()  # positions per native call, each weight tile read once for all
        for start in range(0, n, step):
            chunk = x[start:start + step]
            last = start + chunk.shape[0] >= n
            out, logits = t.native.forward(chunk, t.position, head=t.head if last else None)
            t.position += chunk.shape[0]
            hidden = out[-1]
        return logits, hidden.clone()

    def generate(self, prompt: Prompt, sampling: Sampling = Sampling(), *, max_frames: int = 2047,
                 stats: GenerationStats | None = None) -> Iterator[Any]:
        """Yield each frame's 16 codes (int64 [16]) as soon as they exist; stop at EOS or ``max_frames``."""
        import torch

        from vllm_omni.cpu.sampler import frame_noise_key

        max_frames = whole_number("max_frames", max_frames)
        if prompt.prefill.shape[0] + max_frames > self.max_positions:
            max_frames = self.max_positions - prompt.prefill.shape[0]
            if max_frames < 1:
                raise ValueError(f"the prompt has {prompt.prefill.shape[0]} positions; this generator holds "
                                 f"{self.max_positions}")
        stats = stats if stats is not None else GenerationStats()
        sampler = self._sampler(sampling)
        sub_greedy = sampling.greedy if sampling.subtalker_greedy is None else sampling.subtalker_greedy
        eos = self.spec.eos_id
        t0 = time.perf_counter()
        logits, hidden = self._prefill(prompt.prefill)
        stats.prefill_ms = (time.perf_counter() - t0) * 1e3
        stats.prefill_positions = prompt.prefill.shape[0]
        t1 = time.perf_counter()
        c0 = self._choose(sampler, logits, sampling.greedy)
        sample_ms = (time.perf_counter() - t1) * 1e3
        for frame in range(max_frames):
            if c0 == eos:
                stats.stopped_at_eos = True
                return
            times = StepStats(talker_ms=0.0, predictor_ms=0.0, sampler_ms=sample_ms, bookkeeping_ms=0.0)
            t2 = time.perf_counter()
            codes, embed_sum = self.predictor.frame(
                hidden, self.codec_embedding[c0], greedy=sub_greedy, temperature=sampling.subtalker_temperature,
                top_k=sampling.subtalker_top_k, noise_key=None if sub_greedy else frame_noise_key(sampling.seed, frame))
            t3 = time.perf_counter()
            row = torch.empty(16, dtype=torch.int64)
            row[0] = c0
            row[1:] = codes
            times.predictor_ms = (t3 - t2) * 1e3
            stats.frames.append(times)
            yield row
            if frame + 1 == max_frames:
                return
            t4 = time.perf_counter()
            x = embed_sum + prompt.text_term(frame)
            t5 = time.perf_counter()
            logits, hidden = self.talker.step(x)
            t6 = time.perf_counter()
            c0 = self._choose(sampler, logits, sampling.greedy)
            t7 = time.perf_counter()
            times.bookkeeping_ms = (t5 - t4) * 1e3
            times.talker_ms = (t6 - t5) * 1e3
            sample_ms = (t7 - t6) * 1e3

    @staticmethod
    def _choose(sampler, logits, greedy: bool) -> int:
        """c0 from the talker's logits: the official processors, then argmax (greedy) or a draw."""
        if not greedy:
            return sampler.sample(logits)
        return sampler.greedy(logits)
