"""Several utterances stepping together: one talker call and one predictor call per frame for all.

A stream's step on a CPU is bound by reading the weights (a 0.6B int4 talker step reads about
250 MB for one row of arithmetic), so streams that step together read each weight tile once for
all of them (``NativeStack.forward_rows``, ``FusedPredictor.frames``). Each utterance keeps its
own talker KV cache, predictor cache, sampler, position and frame count, so its codes are the
ones it gets alone; the tests compare the two.

``BatchedGenerator.step(utterances)`` advances every utterance it is given by one frame:

1. those whose c0 is sampled get their frame's 16 codes, their predictor passes in one call per
   sampling setting (an EOS c0 ends the utterance there, its frame dropped, as the official loop
   drops it);
2. one talker call then runs their next step and, in the rows left (``vo_max_tokens`` a call),
   the prompt of any utterance still prefilling: an utterance joins at the next step without a
   call of its own, and the others do not wait for a whole prefill beyond the rows it takes.

Each step first runs ``CodeGenerator.fit_threads``: on the cores other processes leave free
(``vllm_omni.cpu.free_cores``), recorded per frame in each utterance's ``stats.threads``.
An utterance leaves at its EOS or its frame limit; its caches go back to a pool for the next.
``CodeGenerator.generate`` is this loop with one utterance.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm_omni.cpu.checks import whole_number
from vllm_omni.cpu.frame import StepStats
from vllm_omni.tts.prompt import Prompt


@dataclass(eq=False)
class Utterance:
    """One stream's generation state (see the module doc); ``stats`` as ``generate`` fills them."""

    prompt: Prompt
    sampling: Any  # generate.Sampling
    max_frames: int
    sampler: Any
    talker_cache: Any
    predictor_cache: Any
    stats: Any  # generate.GenerationStats
    prefilled: int = 0  # prompt positions already in the talker cache
    c0: int | None = None  # the next frame's codebook-0 id, once sampled
    hidden: Any = None  # the talker's hidden state that c0 came from
    frame: int = 0  # frames made
    done: bool = False
    started: float = field(default_factory=time.perf_counter)
    _pending_sample_ms: float = 0.0

    @property
    def sub_greedy(self) -> bool:
        s = self.sampling
        return s.greedy if s.subtalker_greedy is None else s.subtalker_greedy


class BatchedGenerator:
    """Steps utterances of one ``CodeGenerator`` together (see the module doc)."""

    def __init__(self, generator: Any, max_streams: int | None = None):
        self.gen = generator
        limit = int(generator.predictor.max_streams)
        self.max_streams = limit if max_streams is None else whole_number("max_streams", max_streams, 1, limit)
        self.max_rows = int(generator.talker.lib.vo_max_tokens())
        self._pool: list[tuple[Any, Any]] = []

    def start(self, prompt: Prompt, sampling: Any, max_frames: int, stats: Any) -> Utterance:
        """A new utterance of ``prompt``; it prefills in the next ``step`` calls it is given to."""
        gen = self.gen
        n = prompt.prefill.shape[0]
        max_frames = whole_number("max_frames", max_frames)
        if n + 1 > gen.max_positions:
            raise ValueError(f"the prompt has {n} positions; this generator holds {gen.max_positions}")
        max_frames = min(max_frames, gen.max_positions - n)
        talker, predictor = self._pool.pop() if self._pool else (gen.talker.native.new_cache(),
                                                                 gen.predictor.new_cache())
        stats.prefill_positions = n
        return Utterance(prompt, sampling, max_frames, gen.sampler(sampling), talker, predictor, stats)

    def release(self, u: Utterance) -> None:
        """Give an utterance's caches back (it must not be stepped again)."""
        u.done = True
        if u.talker_cache is not None and len(self._pool) < self.max_streams:
            self._pool.append((u.talker_cache, u.predictor_cache))
        u.talker_cache = u.predictor_cache = None

    def step(self, utterances: list[Utterance]) -> list[tuple[Utterance, Any]]:
        """One frame of each utterance that has a c0, and the talker's next rows for all of them:
        [(utterance, codes int64 [16])] in the order given; ``done`` is set on those that ended."""
        import torch

        from vllm_omni.cpu.sampler import frame_noise_key

        live = [u for u in utterances if not u.done]
        if len(live) > self.max_streams:
            raise ValueError(f"{len(live)} utterances in one step; this generator takes {self.max_streams}")
        gen, eos = self.gen, self.gen.spec.eos_id
        threads = gen.fit_threads()
        ready = []
        for u in live:
            if u.c0 == eos:
                u.done = u.stats.stopped_at_eos = True
            elif u.c0 is not None:
                ready.append(u)
        made: list[tuple[Utterance, Any]] = []
        t0 = time.perf_counter()
        groups: dict[tuple, list[Utterance]] = {}
        for u in ready:
            s = u.sampling
            groups.setdefault((u.sub_greedy, s.subtalker_temperature, s.subtalker_top_k), []).append(u)
        sums = {}
        for (greedy, temperature, top_k), us in groups.items():
            codes, embed = gen.predictor.frames(
                torch.stack([u.hidden for u in us]), gen.codec_embedding[[u.c0 for u in us]],
                [u.predictor_cache for u in us], greedy=greedy, temperature=temperature, top_k=top_k,
                noise_keys=None if greedy else [frame_noise_key(u.sampling.seed, u.frame) for u in us])
            for i, u in enumerate(us):
                row = torch.empty(16, dtype=torch.int64)
                row[0] = u.c0
                row[1:] = codes[i]
                sums[u] = embed[i]
                made.append((u, row))
        predictor_ms = (time.perf_counter() - t0) * 1e3
        made.sort(key=lambda m: utterances.index(m[0]))
        for u, _ in made:
            u.stats.frames.append(StepStats(talker_ms=0.0, predictor_ms=predictor_ms, sampler_ms=u._pending_sample_ms,
                                            bookkeeping_ms=0.0))
            u.stats.threads.append(threads)
            u.frame += 1
            if u.frame == u.max_frames:
                u.done = True
        self._talk([u for u, _ in made if not u.done], sums, [u for u in live if u.c0 is None and not u.done])
        return made

    def _talk(self, stepping: list[Utterance], sums: dict, joining: list[Utterance]) -> None:
        """One talker call: a step row for each of ``stepping``, then prompt rows of ``joining`` in the
        room left; rows whose logits are needed go last (``forward_rows``' head_rows)."""
        import torch

        t0 = time.perf_counter()
        plain: list[tuple[Any, int, Utterance]] = []  # prompt rows that need no logits
        wanted: list[tuple[Any, int, Utterance]] = []  # rows whose logits give a c0
        for u in stepping:
            wanted.append((sums[u] + u.prompt.text_term(u.frame - 1), u.prefilled + u.frame - 1, u))  # after frame f: n + f
        room = self.max_rows - len(wanted)
        for u in joining:
            if room <= 0:
                break
            n = u.prompt.prefill.shape[0]
            take = min(room, n - u.prefilled)
            rows = u.prompt.prefill[u.prefilled:u.prefilled + take]
            ends = u.prefilled + take == n
            for j in range(take - 1 if ends else take):
                plain.append((rows[j], u.prefilled + j, u))
            if ends:
                wanted.append((rows[take - 1], n - 1, u))
            u.prefilled += take
            room -= take
        rows = plain + wanted
        if not rows:
            return
        t1 = time.perf_counter()
        gen = self.gen
        out, logits = gen.talker.native.forward_rows(
            torch.stack([r[0] for r in rows]), [r[1] for r in rows], [r[2].talker_cache for r in rows],
            head=gen.talker.head if wanted else None, head_rows=len(wanted) or None)
        t2 = time.perf_counter()
        for i, (_, _, u) in enumerate(wanted):
            t3 = time.perf_counter()
            u.hidden = out[len(plain) + i].clone()
            u.c0 = gen.choose(u.sampler, logits[i], u.sampling.greedy)
            u._pending_sample_ms = (time.perf_counter() - t3) * 1e3
            if u.frame == 0:
                u.stats.prefill_ms = (time.perf_counter() - u.started) * 1e3
            else:
                f = u.stats.frames[-1]
                f.talker_ms, f.bookkeeping_ms = (t2 - t1) * 1e3, (t1 - t0) * 1e3
