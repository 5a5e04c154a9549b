"""The speaker embedding of a Base checkpoint: 24 kHz audio -> one vector of the talker's width.

Two stages, as the official ``extract_speaker_embedding`` runs them (``qwen_tts`` 0.1.1,
``core/models/modeling_qwen3_tts.py``):

1. ``mel``: a log-mel spectrogram, 128 bands from 0 to 12 kHz of a 1024-point STFT (Hann
   window, hop 256) of the signal reflect-padded by 384 samples a side; the filterbank is
   Slaney's (``slaney_mel_filters``), the magnitude ``sqrt(re^2 + im^2 + 1e-9)``, the log of it
   clamped at 1e-5.
2. ``SpeakerEncoder``: ECAPA-TDNN over the frames -- a TDNN, SE-Res2Net blocks, the concatenation
   of their outputs through one more TDNN, attentive statistics pooling (a weighted mean and
   standard deviation over time), and a 1x1 convolution to the embedding. Every convolution pads
   "same" by reflection.

The official code runs this once per reference; so does a voice file (``vllm_omni.tts.voice``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vllm_omni.tts.config import SpeakerEncoderConfig

SAMPLE_RATE = 24000
N_FFT, HOP, WINDOW, N_MELS, FMIN, FMAX = 1024, 256, 1024, 128, 0.0, 12000.0
PREFIX = "speaker_encoder"


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (200/3 Hz a mel) below 1 kHz, logarithmic above (27 mels per factor 6.4)."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 200.0 / 3.0
    knee_mel, step = 1000.0 / linear, math.log(6.4) / 27.0
    mel = hz / linear
    above = hz >= 1000.0
    mel[above] = knee_mel + np.log(hz[above] / 1000.0) / step
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 / 3.0
    knee_mel, step = 1000.0 / linear, math.log(6.4) / 27.0
    hz = mel * linear
    above = mel >= knee_mel
    hz[above] = 1000.0 * np.exp(step * (mel[above] - knee_mel))
    return hz


def slaney_mel_filters(rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, fmin: float = FMIN,
                       fmax: float = FMAX) -> Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters with centres evenly spaced on Slaney's mel scale, each
    scaled to unit area (2 / its width in Hz): the filterbank the official mel takes from librosa."""
    bins = np.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([fmin]))[0], _hz_to_mel(np.array([fmax]))[0], n_mels + 2))
    widths = np.diff(edges)
    out = np.zeros((n_mels, bins.size), dtype=np.float32)
    for m in range(n_mels):
        rising = (bins - edges[m]) / widths[m]
        falling = (edges[m + 2] - bins) / widths[m + 1]
        out[m] = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[m + 2] - edges[m]))
    return torch.from_numpy(out)


_FILTERS: dict[str, Tensor] = {}


def mel(samples: Tensor) -> Tensor:
    """Log-mel frames [T, 128] of fp32 24 kHz samples [N] (see the module doc)."""
    if "mel" not in _FILTERS:
        _FILTERS["mel"] = slaney_mel_filters()
        _FILTERS["window"] = torch.hann_window(WINDOW)
    pad = (N_FFT - HOP) // 2
    y = F.pad(samples.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WINDOW, window=_FILTERS["window"], center=False,
                      normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(_FILTERS["mel"], magnitude), min=1e-5))[0].transpose(0, 1)


def _same(x: Tensor, w: Tensor, b: Tensor | None, dilation: int = 1) -> Tensor:
    """A stride-1 convolution padded "same" by reflection (left gets the smaller half)."""
    total = dilation * (w.shape[-1] - 1)
    if total:
        x = F.pad(x, (total // 2, total - total // 2), mode="reflect")
    return F.conv1d(x, w, b, dilation=dilation)


class SpeakerEncoder:
    """ECAPA-TDNN with the weights of a Base checkpoint (``Checkpoint.speaker_encoder_weights``)."""

    def __init__(self, weights: dict[str, Any], cfg: SpeakerEncoderConfig):
        self.w, self.cfg = weights, cfg

    def _tdnn(self, x: Tensor, name: str, dilation: int = 1) -> Tensor:
        return torch.relu(_same(x, self.w[f"{name}.conv.weight"], self.w[f"{name}.conv.bias"], dilation))

    def _conv(self, x: Tensor, name: str) -> Tensor:
        return _same(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def _se_res2net(self, x: Tensor, i: int) -> Tensor:
        p, cfg = f"{PREFIX}.blocks.{i}", self.cfg
        h = self._tdnn(x, f"{p}.tdnn1")
        parts, prev = [], None
        for j, part in enumerate(torch.chunk(h, cfg.res2net_scale, dim=1)):
            if j == 0:
                prev = part
            else:
                prev = self._tdnn(part if j == 1 else part + prev, f"{p}.res2net_block.blocks.{j - 1}", cfg.dilations[i])
            parts.append(prev)
        h = self._tdnn(torch.cat(parts, dim=1), f"{p}.tdnn2")
        s = torch.relu(self._conv(h.mean(dim=2, keepdim=True), f"{p}.se_block.conv1"))
        h = h * torch.sigmoid(self._conv(s, f"{p}.se_block.conv2"))
        return h + x

    @staticmethod
    def _stats(x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def _pool(self, x: Tensor) -> Tensor:
        """Attentive statistics pooling: [1, C, T] -> [1, 2C, 1]."""
        t = x.shape[-1]
        uniform = torch.full((1, 1, t), 1.0 / t)
        mean, std = self._stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).repeat(1, 1, t), std.unsqueeze(2).repeat(1, 1, t)], dim=1)
        scores = self._conv(torch.tanh(self._tdnn(context, f"{PREFIX}.asp.tdnn")), f"{PREFIX}.asp.conv")
        mean, std = self._stats(x, F.softmax(scores, dim=2))
        return torch.cat((mean, std), dim=1).unsqueeze(2)

    @torch.inference_mode()
    def embed_mel(self, frames: Tensor) -> Tensor:
        """The embedding [dim] of log-mel frames [T, mel_dim]."""
        cfg = self.cfg
        x = frames.float().transpose(0, 1)[None]
        outs = [self._tdnn(x, f"{PREFIX}.blocks.0", cfg.dilations[0])]
        for i in range(1, len(cfg.channels) - 1):
            outs.append(self._se_res2net(outs[-1], i))
        h = self._tdnn(torch.cat(outs[1:], dim=1), f"{PREFIX}.mfa", cfg.dilations[-1])
        return self._conv(self._pool(h), f"{PREFIX}.fc")[0, :, 0]

    def embed(self, samples: Tensor) -> Tensor:
        """The embedding [dim] of 24 kHz samples [N]."""
        return self.embed_mel(mel(samples))
