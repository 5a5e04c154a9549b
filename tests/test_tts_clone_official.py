"""Voice cloning equal to the official implementation, on the same Base checkpoint and the same recordings.

The official side (``qwen_tts_side.py clone``, in ``.venv-official``) writes a Base checkpoint with
the official classes (0.6B widths, fewer layers, a narrower decoder; the speaker encoder and the
12 Hz encoder at their published shapes), reads each reference as the official wrapper does, and
runs ``create_voice_clone_prompt``, ``model.generate`` (greedy, fp32) and ``generate_voice_clone``.
This side reads the same files with ``reference_audio``, clones with ``voice.Cloner``, prompts
with ``voice_prompt`` and decodes with the decoder primed on the reference codes, and compares:

- the 24 kHz reference waveform within 1e-6, the mel and the speaker embedding within 1e-4, the
  reference codes exactly;
- greedy codes, every codebook of every frame: x-vector only and in context, both text modes,
  an English and a Chinese target, a target text longer than the reference's codec side and one
  shorter;
- the cloned audio within 1e-4 of ``generate_voice_clone``'s (the reference decoded in front,
  then cut), aligned on the official cut, which may fall one sample early.

References are real speech (``tests/fixtures/speech``, espeak-ng) in four containers and rates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from vllm_omni.testing import official
from vllm_omni.tts.checkpoint import load_checkpoint
from vllm_omni.tts.decoder import StreamingDecoder
from vllm_omni.tts.generate import CodeGenerator, Sampling
from vllm_omni.tts.random_checkpoint import checkpoint_configs
from vllm_omni.tts.reference_audio import read_reference
from vllm_omni.tts.speaker_encoder import mel
from vllm_omni.tts.voice import Cloner
from vllm_omni.tts.voice_prompt import build_voice_prompt

pytestmark = pytest.mark.slow

SPEECH = Path(__file__).parent / "fixtures" / "speech"
EN = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old tree."
ZH = "今天天气很好，我们去公园散步吧。"
LONG = ("Here the text to speak is much longer than the reference, so that in streaming text the words run past the "
        "reference frames and trail into the generated ones, one token per frame, as the official layout has it.")


official_env = pytest.fixture(scope="session", autouse=True)(official.official_or_skip)


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> dict[str, Path]:
    """The references: the English WAV as it is (22050 Hz), a stereo FLAC at 16 kHz, a 24 kHz WAV (no
    resampling), and the Chinese one as OGG Vorbis at 48 kHz (the samples relabelled, not resampled)."""
    out = tmp_path_factory.mktemp("refs")
    en, _ = sf.read(SPEECH / "reference-en.wav", dtype="float32")
    zh, _ = sf.read(SPEECH / "reference-zh.wav", dtype="float32")
    files = {"en": SPEECH / "reference-en.wav", "en-stereo": out / "en-stereo.flac", "en24": out / "en24.wav",
             "zh": out / "zh.ogg"}
    sf.write(files["en-stereo"], np.stack([en, 0.5 * en[::-1]], axis=1), 16000, format="FLAC")
    sf.write(files["en24"], en[: 24000 * 4], 24000, subtype="PCM_16")
    sf.write(files["zh"], zh, 48000, format="OGG", subtype="VORBIS")
    return files


def _prompts(refs: dict[str, Path]) -> list[dict]:
    def p(text, ref, language, icl, non_streaming=False, frames=24):
        return dict(text=text, ref_audio=str(refs[ref]), ref_text={"zh": ZH}.get(ref, EN) if icl else None,
                    x_vector_only=not icl, language=language, non_streaming_mode=non_streaming, max_new_tokens=frames)

    return [
        p("Hello from a cloned voice.", "en", "english", icl=False),
        p("Hello from a cloned voice, in context.", "en-stereo", "english", icl=True),
        p("The whole text goes into the prompt here.", "en-stereo", "english", icl=True, non_streaming=True),
        p("我们明天早上八点在学校门口见面。", "zh", "chinese", icl=True),
        p("我们明天早上八点见面。", "zh", "auto", icl=False, non_streaming=True),
        p(LONG, "en24", "english", icl=True),
    ]


PROMPT_IDS = ["x-vector", "icl", "icl-non-streaming", "icl-chinese", "x-vector-chinese-non-streaming",
              "icl-text-longer-than-reference"]


@pytest.fixture(scope="module")
def base(tmp_path_factory, refs):
    work = tmp_path_factory.mktemp("clone-official")
    root = official.write_official_checkpoint(work / "base", checkpoint_configs(
        "0.6B", model_type="base", talker_layers=3, predictor_layers=2, decoder_layers=2, text_hidden=256,
        decoder_dim=384))
    request = {"references": [{"audio": str(refs[k])} for k in refs], "prompts": _prompts(refs)}
    req, out = work / "request.json", work / "out.npz"
    req.write_text(json.dumps(request))
    official.run_side("clone", root, req, out, threads=2)
    with np.load(out) as data:
        results = {k: data[k] for k in data.files}
    return load_checkpoint(root), Cloner(load_checkpoint(root)), results


def test_the_same_soxr_on_both_sides(base):
    import soxr

    assert str(base[2]["soxr_version"]) == soxr.__version__


@pytest.mark.parametrize("i,name", list(enumerate(["en", "en-stereo", "en24", "zh"])))
def test_reference_audio_embedding_and_codes_equal_the_official(base, refs, i, name):
    ck, cloner, res = base
    audio = read_reference(refs[name])
    assert audio.source_rate == int(res[f"ref_{i}_sr"])
    theirs = res[f"ref_{i}_wav24"]
    assert audio.samples.shape == theirs.shape and np.abs(audio.samples - theirs).max() < 1e-6
    samples = torch.from_numpy(audio.samples)
    ours_mel = mel(samples).transpose(0, 1).numpy()
    assert ours_mel.shape == res[f"ref_{i}_mel"].shape
    assert np.abs(ours_mel - res[f"ref_{i}_mel"]).max() < 1e-4
    emb = cloner.speaker_encoder.embed(samples).numpy()
    assert float(np.abs(emb).std()) > 0.05  # the embedding carries something
    assert np.abs(emb - res[f"ref_{i}_embedding"]).max() < 1e-4
    codes = cloner.speech_encoder.encode(samples).numpy()
    theirs = res[f"ref_{i}_codes"]
    assert codes.shape == theirs.shape == (-(-audio.samples.shape[0] // 1920), 16)
    diff = np.argwhere(codes != theirs)
    assert not diff.size, f"first different code at frame {diff[0][0]}, codebook {diff[0][1]} of {len(codes)} frames"
    assert len(np.unique(codes[:, 0])) > 3  # not a constant code


def _ours(ck, cloner, prompt: dict):
    audio = read_reference(prompt["ref_audio"])
    voice = cloner.clone(audio, prompt["ref_text"], prompt["x_vector_only"])
    p = build_voice_prompt(ck, prompt["text"], voice, language=prompt["language"],
                           streaming_text=not prompt["non_streaming_mode"])
    gen = CodeGenerator(ck, "fp32", 2, max_positions=512)
    rows = list(gen.generate(p, Sampling(greedy=True), max_frames=prompt["max_new_tokens"] - 1))
    return voice, p, (torch.stack(rows).numpy() if rows else np.zeros((0, 16), dtype=np.int64))


@pytest.mark.parametrize("i", range(6), ids=PROMPT_IDS)
def test_cloned_greedy_codes_and_audio_equal_the_official(base, refs, i):
    ck, cloner, res = base
    prompt = _prompts(refs)[i]
    voice, p, ours = _ours(ck, cloner, prompt)
    theirs = res[f"codes_{i}"]
    assert len(theirs) >= 5  # the comparison covers frames (the last prompt's random weights say EOS at frame 6)
    n = min(len(ours), len(theirs))
    diff = np.argwhere(ours[:n] != theirs[:n])
    assert not diff.size, (f"first difference at frame {diff[0][0]}, codebook {diff[0][1]}: ours "
                           f"{ours[diff[0][0], diff[0][1]]}, official {theirs[diff[0][0], diff[0][1]]}")
    assert len(ours) == len(theirs)
    if i == 5:  # the branch where the text side outruns the reference's codec side
        assert p.trailing.shape[0] > 1
    dec = StreamingDecoder(ck.decoder, ck.config.decoder)
    official_wav = res[f"wav_{i}"]
    if voice.icl:
        ref_frames, total = voice.codes.shape[0], voice.codes.shape[0] + len(ours)
        dec.prime(voice.codes)  # primed as a voice is (Speech.prepare_voice): the reference's audio is never made
        cut = int(ref_frames / total * total * 1920)  # where the official output starts
        start = ref_frames * 1920
        assert cut in (start, start - 1)
        official_wav = official_wav[start - cut:]
    ours_wav = dec.push(torch.from_numpy(ours)).numpy()
    assert ours_wav.shape == official_wav.shape and float(np.abs(ours_wav).std()) > 0.01
    assert np.abs(ours_wav - official_wav).max() < 1e-4
