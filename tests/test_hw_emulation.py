"""Hardware profiles: selection, VLLM_OMNI_HW_PROFILE overrides, and translation to engine args."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_omni.hw_emulation import (
    CHOICES,
    CODE2WAV_KV_BYTES,
    EDGE_DEFAULT,
    ENV_VAR,
    GIB,
    PROFILES,
    CudaInfo,
    apply_overrides,
    capture_sizes,
    deploy_args,
    deploy_profile,
    engine_args,
    get_profile,
    parse_override,
    pick_gpu_profile,
    stage_env,
)

NO_ENV: dict[str, str] = {}
REQUIRED = {"jetson_orin_8g", "jetson_orin_32g", "cuda_discrete_8g", "x86_cpu_avx2",
            "h200", "orin_agx_64g", "orin_nx_16g", "thor"}


def gpu(name="NVIDIA Test", gib=8.0, sms=40, integrated=False):
    return CudaInfo(name, int(gib * GIB), sms, integrated)


def test_required_profiles_exist():
    assert REQUIRED <= set(PROFILES)
    assert EDGE_DEFAULT in PROFILES


def test_study_device_sm_counts():
    assert {k: PROFILES[k].sm_count for k in ("h200", "orin_agx_64g", "orin_nx_16g", "thor")} == {
        "h200": 132, "orin_agx_64g": 16, "orin_nx_16g": 8, "thor": 20}


# --- selection ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (gpu("NVIDIA H200", 139.8, 132), "h200"),
        (gpu("NVIDIA GeForce RTX 4060", 7.6, 24), "cuda_discrete_8g"),
        (gpu("NVIDIA RTX A6000", 47.5, 84), "cuda_default"),
        (gpu("Orin", 7.4, 8, integrated=True), "jetson_orin_8g"),
        (gpu("Orin", 15.3, 8, integrated=True), "orin_nx_16g"),
        (gpu("Orin", 30.6, 14, integrated=True), "jetson_orin_32g"),
        (gpu("Orin", 61.4, 16, integrated=True), "orin_agx_64g"),
        (gpu("NVIDIA Thor", 122.8, 20, integrated=True), "thor"),
    ],
)
def test_auto_picks_gpu_profile_from_memory_and_sms(info, expected):
    assert pick_gpu_profile(info) == expected
    assert deploy_profile("auto", env=NO_ENV, cuda=info).name == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [({"avx2", "fma"}, "x86_cpu_avx2"), ({"avx2", "avx512f", "amx_tile"}, "x86_cpu_amx")],
)
def test_auto_without_gpu_uses_cpu_isa(flags, expected):
    assert deploy_profile("auto", env=NO_ENV, cuda=None, cpu_flags=flags).name == expected


def test_auto_on_cpu_without_avx2_says_what_to_do():
    with pytest.raises(ValueError, match=f"set {ENV_VAR} to one of: jetson_orin_8g"):
        deploy_profile("auto", env=NO_ENV, cuda=None, cpu_flags={"sse2"})


def test_edge_picks_the_edge_default():
    assert deploy_profile("edge", env=NO_ENV).name == EDGE_DEFAULT == "jetson_orin_8g"


def test_unknown_profile_lists_choices():
    with pytest.raises(ValueError, match="valid: auto, edge, jetson_orin_8g"):
        deploy_profile("jetson_nano", env=NO_ENV)
    with pytest.raises(ValueError, match="valid: auto, edge"):
        get_profile("auto")


# --- overrides ------------------------------------------------------------------------------------

def test_override_syntax():
    assert parse_override("jetson_orin_8g") == ("jetson_orin_8g", {})
    assert parse_override("jetson_orin_8g, kv_budget_gib=2,enforce_eager=false") == (
        "jetson_orin_8g", {"kv_budget_gib": 2.0, "enforce_eager": False})
    assert parse_override("max_num_seqs=1") == (None, {"max_num_seqs": 1})


def test_env_profile_replaces_requested_one_and_keys_override_fields():
    p = deploy_profile("h200", env={ENV_VAR: "jetson_orin_8g,kv_budget_gib=2,graph_capture=none"})
    assert (p.name, p.kv_budget_gib, p.graph_capture) == ("jetson_orin_8g", 2.0, "none")
    assert engine_args(p)["kv_cache_memory_bytes"] == 2 * GIB
    assert engine_args(p)["enforce_eager"] is True


def test_env_keys_alone_apply_to_the_detected_profile():
    p = deploy_profile("auto", env={ENV_VAR: "max_num_seqs=1"}, cuda=gpu("Orin", 61.4, 16, True))
    assert (p.name, p.max_num_seqs) == ("orin_agx_64g", 1)


def test_enforce_eager_maps_to_graph_capture():
    base = get_profile("jetson_orin_8g")
    assert apply_overrides(base, {"enforce_eager": True}).graph_capture == "none"
    assert apply_overrides(base, {"enforce_eager": False}).graph_capture == "all"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jetson_nano", "unknown hardware profile 'jetson_nano'; valid: auto, edge"),
        ("jetson_orin_8g,kv_budget=2", "unknown key 'kv_budget'; valid keys: kv_budget_gib"),
        ("jetson_orin_8g,kv_budget_gib=-1", "bad value '-1' for kv_budget_gib: expected a finite number above 0"),
        ("jetson_orin_8g,kv_budget_gib=lots", "expected a finite number above 0"),
        ("jetson_orin_8g,kv_budget_gib=inf", "bad value 'inf' for kv_budget_gib: expected a finite number above 0"),
        ("jetson_orin_8g,enforce_eager=maybe", "expected true or false"),
        ("jetson_orin_8g,graph_capture=talker", "expected one of all, talker\\+predictor, none"),
        ("jetson_orin_8g,max_num_seqs=0", "expected an integer of 1 or more"),
        ("jetson_orin_8g,gpu_memory_utilization=1.5", "fraction in \\(0, 1\\]"),
        ("jetson_orin_8g,enforce_eager=true,graph_capture=all", "not both"),
        ("jetson_orin_8g,,max_num_seqs=1", "empty item"),
        ("max_num_seqs=1,jetson_orin_8g", "only the first item may name a profile"),
        ("jetson_orin_8g,max_num_seqs=1,max_num_seqs=2", "given twice"),
    ],
)
def test_bad_overrides_say_what_to_do(text, message):
    with pytest.raises(ValueError, match=message):
        deploy_profile("auto", env={ENV_VAR: text}, cuda=None, cpu_flags={"avx2"})


def test_overrides_that_do_not_fit_the_profile_kind_are_refused():
    with pytest.raises(ValueError, match="CPU profile: CUDA graphs do not apply"):
        deploy_profile("x86_cpu_avx2", env={ENV_VAR: "graph_capture=all"})
    with pytest.raises(ValueError, match="cpu_cores applies to CPU profiles only"):
        deploy_profile("h200", env={ENV_VAR: "cpu_cores=4"})
    with pytest.raises(ValueError, match="2 or more"):
        deploy_profile("x86_cpu_avx2", env={ENV_VAR: "cpu_cores=1"})


# --- translation ----------------------------------------------------------------------------------

def test_8g_profile_keeps_graphs_for_talker_and_predictor_only():
    p = get_profile("jetson_orin_8g")
    assert p.graph_capture == "talker+predictor"
    talker, vocoder = engine_args(p, "talker"), engine_args(p, "code2wav")
    assert talker["enforce_eager"] is False
    assert talker["compilation_config"] == {"cudagraph_capture_sizes": [1, 2]}
    assert vocoder["enforce_eager"] is True and "compilation_config" not in vocoder
    assert talker["kv_cache_memory_bytes"] == 1 * GIB
    assert vocoder["kv_cache_memory_bytes"] == CODE2WAV_KV_BYTES


def test_8g_profile_can_reproduce_the_studys_eager_run():
    p = deploy_profile("edge", env={ENV_VAR: "graph_capture=none"})
    assert all(engine_args(p, s)["enforce_eager"] for s in ("talker", "code2wav"))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_translates(name):
    p = PROFILES[name]
    stages = deploy_args(p)
    assert set(stages) == {"talker", "code2wav"}
    for stage, d in stages.items():
        args = d["engine_args"]
        assert args["max_num_seqs"] == p.max_num_seqs
        assert args["max_model_len"] == p.max_model_len
        assert isinstance(args["enforce_eager"], bool)
        if p.kind == "cpu":
            assert args["enforce_eager"] is True
            assert "gpu_memory_utilization" not in args
            assert d["env"]["VLLM_CPU_OMP_THREADS_BIND"]
            assert "VLLM_CPU_KVCACHE_SPACE" not in d["env"]  # it would override kv_cache_memory_bytes
        else:
            assert d["env"] == {}
            assert args["enforce_eager"] is (p.graph_capture == "none" or
                                             (p.graph_capture == "talker+predictor" and stage == "code2wav"))
        if p.kv_budget_gib is None:
            assert "kv_cache_memory_bytes" not in args
        elif stage == "talker":
            assert args["kv_cache_memory_bytes"] == int(p.kv_budget_gib * GIB)
    if p.kind == "gpu":
        total = sum(stages[s]["engine_args"]["gpu_memory_utilization"] for s in stages)
        assert total == pytest.approx(p.gpu_memory_utilization)


def test_cpu_core_binding_splits_three_to_one():
    amx = get_profile("x86_cpu_amx")
    assert stage_env(amx, "talker") == {"VLLM_CPU_OMP_THREADS_BIND": "0-11", "OMP_NUM_THREADS": "12"}
    assert stage_env(amx, "code2wav") == {"VLLM_CPU_OMP_THREADS_BIND": "12-15", "OMP_NUM_THREADS": "4"}
    small = deploy_profile("x86_cpu_avx2", env={ENV_VAR: "cpu_cores=2"})
    assert stage_env(small, "talker")["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert stage_env(small, "code2wav")["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(6) == [1, 2, 4, 6]


def test_unknown_stage():
    with pytest.raises(ValueError, match="valid: talker, code2wav"):
        engine_args(get_profile("h200"), "vocoder")


def test_choices_cover_all_profiles():
    assert CHOICES[:2] == ("auto", "edge") and set(CHOICES[2:]) == set(PROFILES)


def test_import_is_light():
    code = "import sys, vllm_omni.hw_emulation; print(sorted(m for m in ('torch', 'numpy', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
