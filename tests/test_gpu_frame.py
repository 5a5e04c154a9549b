"""The static-cache GPU model equals the eager reference (on the CPU, fp32), and the
``gpu-frame`` benchmark plans one child per SM cap, refuses without CUDA, and builds its
artifact from what the children report."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from vllm_omni import mps  # noqa: E402
from vllm_omni.bench import cli, gpu_frame  # noqa: E402
from vllm_omni.bench.common import BenchError  # noqa: E402
from vllm_omni.capabilities import flags  # noqa: E402
from vllm_omni.cpu.reference import ReferencePredictor, ReferenceTalker  # noqa: E402
from vllm_omni.cpu.sampler import draw_uniforms  # noqa: E402
from vllm_omni.cpu.weights import random_predictor_weights, random_talker_weights  # noqa: E402
from vllm_omni.gpu import child  # noqa: E402
from vllm_omni.gpu.static_frame import StaticFrame, StaticPredictor, StaticTalker  # noqa: E402
from vllm_omni.models import get_model  # noqa: E402
from vllm_omni.results import load_file  # noqa: E402

# fp32 on both sides, the same maths in a different order (merged QKV and gate/up matrices,
# attention over the whole static cache with masked slots instead of over the filled part):
# differences are float32 rounding, ~1e-6 on outputs of magnitude 1-3. 1e-4 leaves two
# orders of margin and still catches a wrong position, mask or head mapping (>= 1e-2).
ATOL = 1e-4
P06 = get_model("0.6B")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1 CPU maths gains nothing from a second thread and suffers on a busy host."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def talker_weights():
    return random_talker_weights(P06, seed=0, layers=2)


@pytest.fixture(scope="module")
def predictor_weights():
    return random_predictor_weights(P06, seed=0, layers=2)


@pytest.fixture(scope="module")
def predictors(predictor_weights):
    """(reference, static): built once; a frame rewrites every slot it reads, so sharing is safe."""
    return ReferencePredictor(predictor_weights), StaticPredictor(predictor_weights)


def inputs(seed: int, n: int = 2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(P06.talker.hidden, generator=g) * 0.5 for _ in range(n)]


# --- the static-cache model equals the reference ------------------------------------------------

def test_talker_prefill_and_steps_match_reference(talker_weights):
    ref = ReferenceTalker(talker_weights)
    static = StaticTalker(talker_weights, capacity=32)
    ref.prefill(7, seed=3)
    static.prefill(7, seed=3)
    assert int(static.pos) == 7
    for x in inputs(1, 4):
        ref_logits, ref_hidden = ref.step(x)
        logits, hidden = static.step(x)
        assert logits.dtype == torch.float32 and logits.shape == ref_logits.shape == (P06.codec_vocab,)
        torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(hidden, ref_hidden, atol=ATOL, rtol=0)
    assert int(static.pos) == ref.position == 11


def test_talker_sees_only_written_positions(talker_weights):
    """Rewinding and rewriting a position gives the same step: later slots are masked out."""
    static = StaticTalker(talker_weights, capacity=16)
    static.prefill(4, seed=0)
    x, y = inputs(2)
    first, _ = static.step(x)
    static.step(y)  # slot 5 now holds y's keys
    static.set_position(4)
    again, _ = static.step(x)
    torch.testing.assert_close(again, first, atol=0, rtol=0)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "gumbel-top50"])
def test_predictor_frames_match_reference(predictors, greedy):
    ref, static = predictors
    for frame in range(2):  # consecutive frames: the static cache is never cleared
        past_hidden, c0_embed = inputs(10 + frame)
        u = None if greedy else draw_uniforms(torch.Generator().manual_seed(frame), 15, 2048)
        ref_codes, ref_sum = ref.frame(past_hidden, c0_embed, greedy=greedy, uniforms=u)
        codes, embed_sum = static.frame(past_hidden, c0_embed, u)
        assert torch.equal(codes, ref_codes)
        torch.testing.assert_close(embed_sum, ref_sum, atol=ATOL, rtol=0)


def test_predictor_with_projection_matches_reference_1_7b():
    """1.7B projects talker-width inputs down to the predictor's width on every pass."""
    spec = get_model("1.7B")
    weights = random_predictor_weights(spec, seed=0, layers=1)
    g = torch.Generator().manual_seed(0)
    past_hidden = torch.randn(spec.talker.hidden, generator=g)
    c0_embed = 0.5 * torch.randn(spec.talker.hidden, generator=g)
    ref_codes, ref_sum = ReferencePredictor(weights).frame(past_hidden, c0_embed)
    codes, embed_sum = StaticPredictor(weights).frame(past_hidden, c0_embed)
    assert torch.equal(codes, ref_codes)
    torch.testing.assert_close(embed_sum, ref_sum, atol=ATOL, rtol=0)


def test_frame_glue_feeds_the_reference_loop(talker_weights, predictors):
    """c0 = argmax over the codebook ids, its embedding into the predictor, embed sum + text back."""
    ref_t, (ref_p, static_p) = ReferenceTalker(talker_weights), predictors
    frame = StaticFrame(StaticTalker(talker_weights, capacity=32), static_p,
                        talker_weights.codec_embedding, greedy_residuals=True, seed=0)
    ref_t.prefill(5, seed=0)
    frame.talker.prefill(5, seed=0)
    x = frame.x.clone()
    for _ in range(2):
        frame.talker_part()
        frame.predictor_part()
        logits, hidden = ref_t.step(x)
        c0 = int(torch.argmax(logits[: P06.codebook_size]))
        codes, embed_sum = ref_p.frame(hidden, talker_weights.codec_embedding[c0])
        assert frame.codes.tolist() == [c0, *codes.tolist()]
        x = embed_sum + frame.text
        torch.testing.assert_close(frame.x, x, atol=ATOL, rtol=0)


# ops that read a device value back to the host: forbidden inside a CUDA graph capture
HOST_READS = {"aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.equal", "aten.allclose"}


def test_frame_parts_never_read_a_value_back_to_the_host(talker_weights, predictors):
    """What makes a part capturable, checked on the CPU: no op inside it needs a device value."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    frame = StaticFrame(StaticTalker(talker_weights, capacity=16), predictors[1],
                        talker_weights.codec_embedding, greedy_residuals=False)
    frame.talker.prefill(4)
    with Record() as rec:
        frame.talker_part()
        frame.predictor_part()
    assert {"aten.topk", "aten.index_copy_", "aten.uniform_"} <= rec.ops  # the parts did run, sampling included
    assert not rec.ops & HOST_READS
    with Record() as rec:  # the probe itself catches a read: indexing with a 0-d tensor is one
        torch.arange(4)[torch.tensor(1)]
    assert "aten._local_scalar_dense" in rec.ops


def test_static_cache_bounds_are_checked(talker_weights):
    static = StaticTalker(talker_weights, capacity=8)
    with pytest.raises(ValueError, match="outside the static cache of 8 slots"):
        static.set_position(8)
    with pytest.raises(ValueError, match="cannot prefill 8 positions"):
        static.prefill(8)


# --- the plan: one child per cap, inside one daemon ---------------------------------------------

def test_caps_parse_and_refuse_nonsense():
    assert gpu_frame.parse_caps("100, 25,12%,6") == (100, 25, 12, 6)
    for bad, message in [("0", "not a percentage"), ("101", "not a percentage"), ("half", "not a percentage"),
                         ("12,12", "listed twice")]:
        with pytest.raises(BenchError, match=message):
            gpu_frame.parse_caps(bad)
    with pytest.raises(BenchError, match="not one of graph, eager"):
        gpu_frame.parse_modes("graph,compiled")


def test_plan_gives_each_cap_its_own_client_environment(tmp_path):
    runs = gpu_frame.plan(gpu_frame.DEFAULT_CAPS, use_mps=True)
    assert [r.cap for r in runs] == [100, 25, 12, 6]
    base = {"CUDA_VISIBLE_DEVICES": "3", "PATH": "/bin"}
    envs = [gpu_frame.child_env(r, tmp_path / "pipe", tmp_path / "log", base) for r in runs]
    assert [e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs] == ["100", "25", "12", "6"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0"}  # the daemon's GPU is device 0 to a client
    assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs} == {str(tmp_path / "pipe")}
    assert base == {"CUDA_VISIBLE_DEVICES": "3", "PATH": "/bin"}  # the caller's environment is untouched
    [plain] = gpu_frame.plan(gpu_frame.DEFAULT_CAPS, use_mps=False)
    assert plain.cap is None and gpu_frame.child_env(plain, tmp_path, tmp_path, base) == base
    assert [mps.estimated_sms(r.cap, 132) for r in runs] == [132, 33, 16, 8]


def test_child_command_carries_its_config():
    config = {"model": "0.6B", "layers": 2, "modes": ["graph", "eager"]}
    cmd = gpu_frame.child_command(config)
    assert cmd[:3] == [sys.executable, "-m", "vllm_omni.gpu.child"] and json.loads(cmd[3]) == config


def args_for(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    gpu_frame.register(p.add_subparsers())
    return p.parse_args(["gpu-frame", *argv])


def test_quick_config_is_small_and_full_config_is_the_study_shape():
    quick = gpu_frame.child_config(args_for(["--quick"]))
    full = gpu_frame.child_config(args_for([]))
    assert (quick["layers"], quick["frames"], quick["cache"]) == (2, 5, 8)
    assert (full["layers"], full["frames"], full["cache"], full["modes"]) == (28, 200, 256, ["graph", "eager"])
    with pytest.raises(BenchError, match="--layers must be in 1..28"):
        gpu_frame.child_config(args_for(["--layers", "29"]))


FAKE_PROBE = {"cuda": True, "device": "Test GPU 9", "sms": 132, "memory_gib": 140.0, "capability": "9.0",
              "torch": "x", "cuda_runtime": "12.8"}


def fake_result(cap: str | None) -> dict:
    """A child's report; under a cap its CUDA context reports fewer SMs (a made-up rounding here)."""
    mode = {"talker_ms": 1.0, "predictor_ms": 2.0, "frame_ms": 3.0, "wall_ms": 4.0, "frames": 5, "warmup": 2}
    sms = FAKE_PROBE["sms"] if cap in (None, "100") else 2 * int(cap)
    return {**FAKE_PROBE, "sms": sms, "cap_env": cap, "talker_capacity": 64, "setup_s": 1.0, "peak_gpu_mib": 10,
            "modes": {"graph": mode, "eager": {**mode, "wall_ms": 8.0}}}


class FakeSession:
    started: list[str] = []

    def __init__(self, root, **kw):
        self.pipe_dir, self.log_dir = root / "pipe", root / "log"

    def __enter__(self):
        FakeSession.started.append("start")
        return self

    def __exit__(self, *exc):
        FakeSession.started.append("stop")


def test_run_starts_one_child_per_cap_inside_one_daemon(monkeypatch, tmp_path):
    calls = []

    def run_child(config, env, timeout_s, what):
        calls.append((config.get("probe", False), env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), FakeSession.started[:]))
        return FAKE_PROBE if config.get("probe") else fake_result(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))

    FakeSession.started = []
    monkeypatch.setattr(gpu_frame, "run_child", run_child)
    monkeypatch.setattr(gpu_frame.mps, "MpsSession", FakeSession)
    monkeypatch.setattr(gpu_frame.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert gpu_frame.run(args_for(["--caps", "100,12", "--output", str(tmp_path)])) == 0
    # the probe runs before the daemon starts; every capped child inside it, in order
    assert calls == [(True, None, []), (False, "100", ["start"]), (False, "12", ["start"])]
    assert FakeSession.started == ["start", "stop"]
    art = load_file(tmp_path / "device-simulation" / "gpu-frame-test-gpu-9.json")
    assert art.origin == "measured" and art.provenance["host"]["gpu"] == "Test GPU 9"
    # SMs asked come from the whole GPU (the probe), SMs reported from each capped child
    assert [r[:5] for r in art.rows] == [["100 % (MPS)", 100, 132, 132, "CUDA graph"],
                                         ["100 % (MPS)", 100, 132, 132, "eager"],
                                         ["12 % (MPS)", 12, 16, 24, "CUDA graph"], ["12 % (MPS)", 12, 16, 24, "eager"]]
    assert [r[-1] for r in art.rows] == [0.05, 0.1, 0.05, 0.1]  # RTF = frame wall / 80 ms
    assert art.compare["key_columns"] == ["setting", "mode"]


def test_name_picks_the_file_of_a_second_run_on_the_same_gpu(monkeypatch, tmp_path):
    """--name keeps a rerun beside the committed artifact (a quick run's name ends in -quick)."""
    monkeypatch.setattr(gpu_frame, "run_child",
                        lambda config, env, t, what: FAKE_PROBE if config.get("probe") else fake_result(None))
    assert gpu_frame.run(args_for(["--no-mps", "--quick", "--name", "h200-rerun", "--output", str(tmp_path)])) == 0
    assert [p.name for p in (tmp_path / "device-simulation").iterdir()] == ["h200-rerun-quick.json"]
    art = load_file(tmp_path / "device-simulation" / "h200-rerun-quick.json")
    assert art.id == "device-simulation/h200-rerun-quick" and [r[0] for r in art.rows] == ["no MPS"] * 2


def test_run_refuses_a_child_that_did_not_get_its_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_frame, "run_child",
                        lambda config, env, t, what: FAKE_PROBE if config.get("probe") else fake_result(None))
    monkeypatch.setattr(gpu_frame.mps, "MpsSession", FakeSession)
    monkeypatch.setattr(gpu_frame.shutil, "which", lambda name: "/usr/bin/x")
    with pytest.raises(BenchError, match="started with None as its SM percentage"):
        gpu_frame.run(args_for(["--caps", "25", "--output", str(tmp_path)]))
    assert not (tmp_path / "device-simulation").exists()


def test_caps_and_no_mps_together_are_refused_before_any_child(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_frame, "run_child", lambda *a: pytest.fail("no child may start"))
    with pytest.raises(BenchError, match="give one of them"):
        gpu_frame.run(args_for(["--no-mps", "--caps", "25", "--output", str(tmp_path)]))


def test_caps_without_mps_tools_are_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_frame, "run_child", lambda config, env, t, what: FAKE_PROBE)
    monkeypatch.setattr(gpu_frame.shutil, "which", lambda name: None)
    with pytest.raises(BenchError, match="pass --no-mps"):
        gpu_frame.run(args_for(["--output", str(tmp_path)]))


# --- without CUDA: a clear refusal --------------------------------------------------------------

@pytest.mark.skipif(flags()["HAS_CUDA"], reason="this machine has CUDA")
def test_cli_refuses_without_cuda(tmp_path, capsys):
    assert cli.main(["gpu-frame", "--quick", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-omni-bench gpu-frame: error: gpu-frame needs a CUDA GPU: ")
    assert "sees no CUDA device" in err and not list(tmp_path.iterdir())


def test_child_prints_one_marked_json_line(capsys):
    assert child.main(['{"probe": true}']) == 0
    out = capsys.readouterr().out.strip()
    mark, _, payload = out.partition(" ")
    assert mark == child.RESULT_MARK and json.loads(payload)["cuda"] == flags()["HAS_CUDA"]


def test_importing_the_subcommand_stays_light():
    code = ("import sys, vllm_omni.gpu, vllm_omni.bench.gpu_frame as g; g.register(__import__('argparse')"
            ".ArgumentParser().add_subparsers()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- on a GPU runner ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_graph_replay_matches_eager_on_cuda(talker_weights, predictor_weights):
    from vllm_omni.gpu.static_frame import capture

    def run(replay: bool) -> list[list[int]]:
        frame = StaticFrame(StaticTalker(talker_weights, capacity=64, dtype=torch.bfloat16, device="cuda"),
                            StaticPredictor(predictor_weights, dtype=torch.bfloat16, device="cuda"),
                            talker_weights.codec_embedding, greedy_residuals=True)
        frame.talker.prefill(8)
        x0 = frame.x.clone()
        parts = (frame.talker_part, frame.predictor_part)
        if replay:  # capturing runs warm-up steps: rewind the position and the input afterwards
            parts = (capture(frame.talker_part), capture(frame.predictor_part))
            frame.talker.set_position(8)
            frame.x.copy_(x0)
        codes = []
        for _ in range(3):
            parts[0]()
            parts[1]()
            codes.append(frame.codes.tolist())
        return codes

    assert run(replay=True) == run(replay=False)


@pytest.mark.gpu
def test_child_measures_both_modes_on_cuda():
    out = child.measure({"model": "0.6B", "layers": 2, "dtype": "bfloat16", "seed": 0, "cache": 8, "frames": 3,
                         "warmup": 1, "modes": ["graph", "eager"], "greedy_residuals": False})
    assert out["cuda"] and set(out["modes"]) == {"graph", "eager"}
    for m in out["modes"].values():
        assert 0 < m["talker_ms"] <= m["frame_ms"] and m["wall_ms"] > 0


@pytest.mark.mps
def test_a_capped_child_reports_about_the_sms_it_asked_for():
    """The artifact's 'SMs reported' column rests on this: under MPS, a client's CUDA context
    reports the SMs its cap grants (the driver rounds to pairs), not the whole GPU's."""
    base = dict(os.environ)
    whole = gpu_frame.run_child({"probe": True}, base, 120, "probe")["sms"]
    with mps.MpsSession(mps.default_root() / "test-sms") as session:
        env = gpu_frame.child_env(gpu_frame.ChildRun(25), session.pipe_dir, session.log_dir, base)
        capped = gpu_frame.run_child({"probe": True}, env, 120, "capped probe")["sms"]
    asked = mps.estimated_sms(25, whole)
    assert asked - 2 <= capped <= asked + 2 < whole
