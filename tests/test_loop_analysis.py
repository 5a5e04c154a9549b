"""The loops' speed from their compiled code (vllm_omni.cpu.loop_analysis): the report parsing, the
GNU-to-LLVM syntax fix, and every marked loop found in each build (the GEMVs' tiles, and the
decoder's int8 convolution in the SIMD builds)."""

from __future__ import annotations

import pytest

from vllm_omni.cpu import loop_analysis as L

REPORT = """
[0] Code Region - q4_group

Iterations:        200
Instructions:      11600
Total Cycles:      5040
Block RThroughput: 19.0

[1] Code Region - q4_group

Iterations:        200
Total Cycles:      5100

[2] Code Region - q8_group

Iterations:        100
Total Cycles:      2020
"""


def test_each_regions_cycles_per_iteration_are_read_from_the_report():
    assert L.parse_regions(REPORT) == {"q4_group": [25.2, 25.5], "q8_group": [20.2]}


def test_gccs_sign_extended_byte_immediates_become_llvms_bytes():
    gnu = "\tmovi\tv0.16b, 0xffffffffffffff80\n\tmovi\tv1.8b, 0x0f\n\tmov\tx0, 0xffffffffffffff80\n"
    assert L._llvm_syntax(gnu) == "\tmovi\tv0.16b, 0x80\n\tmovi\tv1.8b, 0x0f\n\tmov\tx0, 0xffffffffffffff80\n"


reason = L.tools_missing()


@pytest.mark.skipif(reason is not None, reason=reason or "")
@pytest.mark.parametrize("build", [L.X86_BUILDS["AVX-512 VNNI"], L.X86_BUILDS["generic C"], L.ARM_CORES["neoverse-n1"],
                                   L.ARM_CORES["neoverse-v1"]], ids=lambda b: b.name)
def test_every_marked_loop_is_found_and_modelled(build):
    regions = L.analyse(build)
    expected = {"generic C": {"q4_row", "q8_row"}, "AVX-512 VNNI": {"q4_group", "q8_group", "i8_conv_vnni"},
                "Neoverse-V1": {"q4_group", "q8_group", "i8_conv_i8mm"}}.get(  # V1 has i8mm: SMMLA
        build.name, {"q4_group", "q8_group", "i8_conv_sdot"})
    assert set(regions) == expected
    for name, r in regions.items():
        assert r["copies"] >= 1 and r["cycles"] > 0
        if name in L.REGION_MACS:  # the decoder's int8 convolution: multiply-adds, its weights in cache
            assert r["macs_per_cycle"] == pytest.approx(L.REGION_MACS[name] / r["cycles"])
        else:
            assert r["bytes_per_cycle"] == pytest.approx(L.REGION_BYTES[name] / r["cycles"])
