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

from dataclasses import dataclass, field
from typing import Any, Iterator

from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.frame import StepStats
from vllm_omni.cpu.free_cores import CoreWatch
from vllm_omni.tts.checkpoint import Checkpoint
from vllm_omni.tts.prompt import Prompt
from vllm_omni.tts.weight_choice import canonical, weight_parts



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
    threads: list[int] = field(default_factory=list)  # the threads each frame ran on (CodeGenerator.fit_threads)
    stopped_at_eos: bool = False


class CodeGenerator:
    """The fused talker and predictor of one checkpoint, ready to generate (weights packed once)."""

    def __init__(self, ckpt: Checkpoint, weights: str = "int4", threads: int | None = None, max_positions: int = 4096,
                 cache: bool = True, share_cores: bool = True):
        from vllm_omni.cpu.fused_talker import FusedTalker
        from vllm_omni.cpu.predictor import FusedPredictor
        from vllm_omni.cpu.quant import pack_now
        from vllm_omni.tts.weight_cache import CACHED_FORMATS, PackedWeights

        talker_fmt, predictor_fmt = weight_parts(weights)
        self.ckpt, self.weights = ckpt, canonical(weights)
        self.max_positions = whole_number("max_positions", max_positions, 2)
        # one cache file per format: a mix reads its talker from one, its predictor from the other
        packers = {f: PackedWeights.open(ckpt, f) for f in dict.fromkeys((talker_fmt, predictor_fmt))
                   if cache and f in CACHED_FORMATS}
        self.caches = list(packers.values())  # empty: not cached (fp32, or asked not to)
        self.talker = FusedTalker(ckpt.talker, talker_fmt, threads, max_positions=self.max_positions,
                                  packer=packers.get(talker_fmt, pack_now))
        self.predictor = FusedPredictor(ckpt.predictor, predictor_fmt, threads, packer=packers.get(predictor_fmt, pack_now))
        for packer in packers.values():
            packer.finish()
        self.codec_embedding = ckpt.talker.codec_embedding
        self.spec = ckpt.config.spec
        self._batch = None
        self.max_threads = self.talker.threads
        self.cores = CoreWatch() if share_cores else None

    @property
    def cache(self):
        """The packed-weight cache of a start in one format (``weight_cache.PackedWeights``; None where it
        is not cached); a mix of formats has one per format in ``caches``."""
        return self.caches[0] if len(self.caches) == 1 else None

    @property
    def threads(self) -> int:
        """The threads the next step runs on (``fit_threads``)."""
        return self.talker.threads

    def fit_threads(self) -> int:
        """Run the next step on the cores other work leaves free (``vllm_omni.cpu.free_cores``), at most
        ``max_threads``; PyTorch's threads (the decoder's) follow. Without ``share_cores``, ``max_threads``."""
        n = self.max_threads if self.cores is None else self.cores.threads(self.max_threads)
        if n != self.talker.threads:
            from vllm_omni.patches.threads import real_set_num_threads

            self.talker.set_threads(n)
            self.predictor.set_threads(n)
            real_set_num_threads()(n)
        return n

    def sampler(self, s: Sampling):
        """A fresh codebook-0 sampler for one utterance with settings ``s``."""
        from vllm_omni.cpu.sampler import FastSampler, SamplerConfig

        cfg = SamplerConfig.for_model(self.spec, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                      repetition_penalty=s.repetition_penalty, min_new_tokens=s.min_new_tokens)
        return FastSampler(cfg, seed=s.seed)

    @property
    def batch(self):
        """The ``BatchedGenerator`` of this generator (``vllm_omni.tts.batch``): several utterances a step."""
        if self._batch is None:
            from vllm_omni.tts.batch import BatchedGenerator

            self._batch = BatchedGenerator(self)
        return self._batch

    def generate(self, prompt: Prompt, sampling: Sampling = Sampling(), *, max_frames: int = 2047,
                 stats: GenerationStats | None = None) -> Iterator[Any]:
        """Yield each frame's 16 codes (int64 [16]) as soon as they exist; stop at EOS or ``max_frames``.

        One utterance stepped alone by ``batch``: the same native calls that step several together.
        """
        stats = stats if stats is not None else GenerationStats()
        u = self.batch.start(prompt, sampling, max_frames, stats)
        try:
            while not u.done:
                for _, codes in self.batch.step([u]):
                    yield codes
        finally:
            self.batch.release(u)

    @staticmethod
    def choose(sampler, logits, greedy: bool) -> int:
        """c0 from the talker's logits: the official processors, then argmax (greedy) or a draw."""
        if not greedy:
            return sampler.sample(logits)
        return sampler.greedy(logits)
