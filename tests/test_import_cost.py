"""Importing vllm_omni (and the CLI parser) must not pull in torch or vllm."""

import subprocess
import sys


def test_import_is_light():
    code = (
        "import sys, vllm_omni, vllm_omni.results, vllm_omni.models, vllm_omni.capabilities;"
        "from vllm_omni.bench.cli import build_parser; build_parser();"
        "heavy = [m for m in ('torch', 'vllm', 'pandas', 'numpy') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing vllm_omni pulled in: {out}"
