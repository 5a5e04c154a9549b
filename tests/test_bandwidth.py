"""The read-bandwidth probe, its huge-page buffers, and ``env``'s host name and the GPU it
reports: correctness only (a positive figure, an artifact that validates)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_quick_probe_returns_positive_gbps():
    from vllm_omni.cpu.bandwidth import measure_read_bandwidth, read_bandwidth_probes

    gbs = measure_read_bandwidth(1, quick=True)
    assert isinstance(gbs, float) and gbs > 0
    probes = read_bandwidth_probes(1, quick=True)
    assert set(probes) == {"native", "torch", "best"}
    assert probes["best"] == max(probes["native"], probes["torch"])
    assert probes["native"] > 0 and probes["torch"] > 0


def test_working_set_probe_takes_part_in_best():
    from vllm_omni.cpu.bandwidth import read_bandwidth_probes, working_set_read_bandwidth

    probes = read_bandwidth_probes(1, quick=True, working_set=8 << 20)
    assert set(probes) == {"native", "torch", "working_set", "working_set_median", "best"}
    assert probes["best"] == max(probes["native"], probes["torch"], probes["working_set"])
    # the median sweep is reported beside the best one, never in its place
    assert 0 < probes["working_set_median"] <= probes["working_set"]
    assert working_set_read_bandwidth(1, 1000, quick=True) > 0  # rounds up to one 2 MiB page


def test_working_set_sweeps_are_each_sweep_of_the_probe():
    from vllm_omni.cpu.bandwidth import PROBE_STREAMS, working_set_read_sweeps

    sweeps = working_set_read_sweeps(1, 4 << 20, quick=True)
    assert set(sweeps) == set(PROBE_STREAMS) == {1, 2, 3, 4}
    for gbs in sweeps.values():
        assert len(gbs) == 64  # the quick mode's sweeps over a 4 MiB buffer, none left unfilled
        assert all(v > 0 for v in gbs)


def test_bench_bandwidth_writes_a_valid_artifact(tmp_path):
    from vllm_omni.bench.cli import main

    assert main(["bandwidth", "--quick", "--threads", "2", "--output", str(tmp_path)]) == 0
    path = tmp_path / "cpu-path" / "read-bandwidth-quick.json"
    data = json.loads(path.read_text())
    assert data["origin"] == "measured"
    assert [r[0] for r in data["rows"]] == [1, 2] and all(r[3] > 0 for r in data["rows"])
    # the provenance names every thread count it has a row for, not the highest alone
    assert data["provenance"]["threads"] == data["provenance"]["host"]["cores_used"] == "1,2"


def test_bench_name_picks_the_file_and_bad_names_are_refused_before_measuring(tmp_path, capsys):
    """--name keeps a second host's run beside the committed one; a bad name never starts a run."""
    import re

    from vllm_omni.bench.cli import main

    assert main(["bandwidth", "--quick", "--threads", "1", "--name", "bw-other-host", "--output", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "cpu-path" / "bw-other-host-quick.json").read_text())
    assert data["id"] == "cpu-path/bw-other-host-quick"
    cpu_id = data["provenance"]["host"]["cpu_id"]
    assert cpu_id is None or re.fullmatch(r"family \d+, model \d+(, stepping \d+)?", cpu_id)
    for command in ("bandwidth", "env", "predictor", "gemv", "talker", "frame", "engines"):
        for bad in ("Upper", "a/b", "-lead", ""):
            with pytest.raises(SystemExit) as info:
                main([command, f"--name={bad}", "--output", str(tmp_path / "never")])
            assert info.value.code == 2
            assert "argument --name: must be lowercase" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_env_default_name_tells_apart_hosts_with_one_model_name(monkeypatch):
    """Two generations that a VM both calls "AMD EPYC" get different default environment files."""
    from vllm_omni.bench import env

    def host(cpu_id):
        return {"model": "AMD EPYC", "flags": set(), "logical_cpus": 2, "cpu_id": cpu_id}

    monkeypatch.setattr(env.provenance, "usable_cpus", lambda: 2)
    names = set()
    for cpu_id in ("family 23, model 1, stepping 2", "family 25, model 17, stepping 1", None):
        monkeypatch.setattr(env.provenance, "cpuinfo", lambda c=cpu_id: host(c))
        names.add(env.host_slug())
    assert names == {"amd-epyc-f23m1-2c", "amd-epyc-f25m17-2c", "amd-epyc-2c"}


def test_huge_arena_views_hold_the_same_values():
    """Packed matrices copied into the huge-page arena keep their bytes, dtypes and shapes."""
    import torch

    from vllm_omni.cpu.hugepages import HUGE_PAGE, into_huge_arena
    from vllm_omni.cpu.quant import quantize

    g = torch.Generator().manual_seed(0)
    mats = [quantize(torch.randn(128, 256, generator=g), f) for f in ("fp32", "int8", "int4")]
    plain = torch.randn(1000, generator=g)
    arena, (a, b, c, d), covered = into_huge_arena(mats + [plain])
    for old, new in zip(mats, (a, b, c)):
        assert torch.equal(old.data, new.data) and new.data.dtype == old.data.dtype
        assert (old.scale is None and new.scale is None) or torch.equal(old.scale, new.scale)
        assert arena.data_ptr() <= new.data.data_ptr() < arena.data_ptr() + arena.numel()
    assert torch.equal(d, plain)
    assert covered % HUGE_PAGE == 0  # 0 where the kernel refuses; whole 2 MiB pages otherwise


def test_huge_arena_pages_are_untouched_even_after_large_frees():
    """An arena built after large tensors were freed still gets huge pages.

    The advice only applies to pages faulted in after it; an arena taken from heap memory that a
    freed tensor had touched stayed in 4 KiB pages (this happened to arenas built after large
    weights had been built and dropped in the same process).
    """
    import torch

    from vllm_omni.cpu.hugepages import HUGE_PAGE, huge_bytes, into_huge_arena

    items = [torch.ones(5 * HUGE_PAGE // 4)]  # 10 MiB of float32
    first, _, covered_first = into_huge_arena(items)
    if not covered_first:
        pytest.skip("no transparent huge pages on this kernel right now")
    assert covered_first == huge_bytes(first.data_ptr(), first.numel())
    # glibc's pattern: freeing a 24 MiB mapped chunk raises its mmap threshold, so the next
    # 16 MiB tensors come from the heap; freed below a live allocation, they leave a touched
    # hole that a plain allocation of the arena's size is served from
    x = torch.ones(6 << 20)
    del x
    big = [torch.ones(4 << 20) for _ in range(8)]
    keep = torch.ones(1 << 10)
    del big
    second, _, covered = into_huge_arena(items)
    assert second.numel() == first.numel() and covered == covered_first
    del keep


def test_env_loads_torch_to_name_the_gpu():
    """`env` says what the host has: it must ask torch even when nothing has loaded it yet
    (the provenance of other commands never loads torch just to look)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from vllm_omni.bench import env\n"
        "assert 'torch' not in sys.modules\n"
        "name = env.gpu()\n"
        "assert 'torch' in sys.modules, 'env did not ask torch'\n"
        "import torch\n"
        "expected = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None\n"
        "assert name == expected, (name, expected)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_env_writes_the_gpu_torch_reports(monkeypatch, tmp_path):
    import torch

    from vllm_omni.bench import cli
    from vllm_omni.results import load

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Example GPU")
    assert cli.main(["env", "--name", "gpu-check", "--output", str(tmp_path)]) == 0
    assert load("environment/gpu-check", root=tmp_path).value("GPU", "value") == "Example GPU"
