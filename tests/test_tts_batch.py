"""Utterances stepped together (vllm_omni.tts.batch) give what each gives alone.

A small random-weight checkpoint in the official layout (our writer). Three prompts (English,
Chinese, a long one) join at different steps, so a step mixes one stream's prompt rows with
the others' frames; each stream's codes must be those ``generate`` gives it alone, greedy in
fp32 (the equality the issue asks for) and sampled in int4 with a seed each. Their audio,
decoded with their decoder states swapped around each other's chunks, must be the audio each
makes alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.tts.generate import GenerationStats, Sampling
from vllm_omni.tts.pipeline import Speech
from vllm_omni.tts.prompt import build_prompt
from vllm_omni.tts.random_checkpoint import write_random_checkpoint

SHAPE = dict(talker_layers=2, predictor_layers=2, decoder_layers=1, text_hidden=256, decoder_dim=384)
TEXTS = [("Hello there, how are you today?", "english", "ryan"),
         ("今天天气很好，我们去公园散步吧。", "chinese", "vivian"),
         ("This is a much longer sentence, so that its prompt takes more rows than one talker call "
          "holds beside the other streams' steps, and it joins over several steps.", "english", "ryan")]
FRAMES = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("batch") / "tiny", "0.6B", dtype="fp32", **SHAPE)


@pytest.fixture(scope="module", params=["fp32", "int4"])
def speech(request, checkpoint) -> Speech:
    return Speech.load(checkpoint, weights=request.param, threads=2, max_positions=256, cache=False)


def _sampling(speech: Speech, i: int) -> Sampling:
    # fp32: greedy, the official equality; int4: sampled, each stream with its own seed
    return Sampling.from_checkpoint(speech.ckpt, greedy=speech.weights == "fp32", seed=11 + i)


def _prompts(speech: Speech):
    return [build_prompt(speech.ckpt, t, speaker=s, language=lang) for t, lang, s in TEXTS]


def test_streams_stepped_together_make_the_codes_each_makes_alone(speech):
    gen = speech.generator
    prompts = _prompts(speech)
    alone = [torch.stack(list(gen.generate(p, _sampling(speech, i), max_frames=FRAMES))) for i, p in enumerate(prompts)]
    batch = gen.batch
    together: list[list] = [[] for _ in prompts]
    live = []
    joins = {0: [0], 2: [1, 2]}  # the second and third join at the third step
    step = 0
    while step == 0 or live:
        for i in joins.get(step, []):
            u = batch.start(prompts[i], _sampling(speech, i), FRAMES, GenerationStats())
            u.index = i
            live.append(u)
        for u, codes in batch.step(live):
            together[u.index].append(codes)
        for u in [u for u in live if u.done]:
            batch.release(u)
            live.remove(u)
        step += 1
    for i, want in enumerate(alone):
        got = torch.stack(together[i])
        assert got.shape == want.shape, f"stream {i}: {got.shape[0]} frames together, {want.shape[0]} alone"
        assert torch.equal(got, want), f"stream {i}: first differing frame {int((got != want).any(1).nonzero()[0])}"


def test_interleaved_utterances_decode_to_the_audio_each_makes_alone(speech):
    kw = [dict(speaker=s, language=lang, max_frames=FRAMES, seed=3 + i, greedy=True) for i, (_, lang, s) in enumerate(TEXTS)]
    alone = [speech.synthesize(t, **k) for (t, _, _), k in zip(TEXTS, kw)]
    batch = speech.generator.batch
    talks = [speech.open(t, **k) for (t, _, _), k in zip(TEXTS, kw)]
    live = [batch.start(s.prompt, s.sampling, s.max_frames, s.stats.generation) for s in talks]
    owner = {id(u): s for u, s in zip(live, talks)}
    # all three stepped together: each frame's codes go to its own Speaking, which decodes its chunks
    # with its own decoder state, swapped in around the others'
    parts: dict[int, list[np.ndarray]] = {id(s): [] for s in talks}
    while live:
        for u, codes in batch.step(live):
            chunk = owner[id(u)].add(codes)
            if chunk is not None:
                parts[id(owner[id(u)])].append(chunk.samples)
        for u in [u for u in live if u.done]:
            tail = owner[id(u)].finish()
            if tail is not None:
                parts[id(owner[id(u)])].append(tail.samples)
            batch.release(u)
            live.remove(u)
    for s, want in zip(talks, alone):
        got = np.concatenate(parts[id(s)])
        assert got.shape == want.shape and np.array_equal(got, want)


def test_more_streams_than_a_step_takes_are_refused(speech):
    batch = speech.generator.batch
    p = _prompts(speech)[0]
    us = [batch.start(p, _sampling(speech, 0), 2, GenerationStats()) for _ in range(batch.max_streams + 1)]
    with pytest.raises(ValueError, match=f"this generator takes {batch.max_streams}"):
        batch.step(us)
    for u in us:
        batch.release(u)
