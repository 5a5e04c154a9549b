"""Rows of several streams in one native call (vo_stack_forward_rows): each stream at its own
position in its own KV cache gives what it gives alone, prefill and step mixed in one call."""

from __future__ import annotations

import pytest
import torch

from vllm_omni.cpu.fused_talker import FusedTalker
from vllm_omni.cpu.weights import random_talker_weights
from vllm_omni.models.spec import get_model


@pytest.fixture(scope="module", params=["fp32", "int4"])
def talker(request) -> FusedTalker:
    weights = random_talker_weights(get_model("0.6B"), seed=3, layers=2)
    return FusedTalker(weights, request.param, threads=2, max_positions=64)


def _alone(talker: FusedTalker, calls: list[torch.Tensor]):
    """Hidden states and logits of one stream's calls, run on the stack's own cache from position 0."""
    outs, logits, pos = [], [], 0
    for x in calls:
        out, lg = talker.native.forward(x, pos, head=talker.head)
        outs.append(out[-1])
        logits.append(lg)
        pos += x.shape[0]
    return outs, logits


def test_streams_in_one_call_equal_each_stream_alone(talker):
    g = torch.Generator().manual_seed(5)
    a = [torch.randn(3, 1024, generator=g) * 0.5, torch.randn(1, 1024, generator=g) * 0.5]  # prefill 3, step 1
    b = [torch.randn(5, 1024, generator=g) * 0.5, torch.randn(1, 1024, generator=g) * 0.5]
    want_a, want_b = _alone(talker, a), _alone(talker, b)
    ca, cb = talker.native.new_cache(), talker.native.new_cache()
    # call 1: both prefills together (8 rows); call 2: both steps, at positions 3 and 5
    out1, lg1 = talker.native.forward_rows(torch.cat([a[0], b[0]]), [0, 1, 2, 0, 1, 2, 3, 4], [ca] * 3 + [cb] * 5,
                                           head=talker.head)
    out2, lg2 = talker.native.forward_rows(torch.cat([a[1], b[1]]), [3, 5], [ca, cb], head=talker.head)
    tol = 1e-4
    for got, want in ((out1[2], want_a[0][0]), (out1[7], want_b[0][0]), (out2[0], want_a[0][1]), (out2[1], want_b[0][1])):
        assert float((got - want).abs().max()) < tol
    for got, want in ((lg1[2], want_a[1][0]), (lg1[7], want_b[1][0]), (lg2[0], want_a[1][1]), (lg2[1], want_b[1][1])):
        assert float((got - want).abs().max()) < tol
    assert int(lg2[0].argmax()) == int(want_a[1][1].argmax()) and int(lg2[1].argmax()) == int(want_b[1][1].argmax())


def test_bad_rows_are_refused(talker):
    x = torch.zeros(2, 1024)
    c = talker.native.new_cache()
    with pytest.raises(ValueError, match="2 rows need 2 positions"):
        talker.native.forward_rows(x, [0], [c, c])
    with pytest.raises(RuntimeError, match="vo_stack_forward_rows failed"):
        talker.native.forward_rows(x, [0, 64], [c, c])  # beyond max_positions
    small = ([k[:, :8].contiguous() for k in c[0]], [v[:, :8].contiguous() for v in c[1]])
    with pytest.raises(ValueError, match="expected"):
        talker.native.forward_rows(x, [0, 1], [small, small])
