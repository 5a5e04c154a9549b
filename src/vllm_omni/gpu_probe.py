"""The GPU identity check behind the environment page: dense bf16 matmul TFLOPS.

The study identified its "L20X"-labelled cards as H200-class by this probe (8192³, 20
iterations): throughput, not the driver's label, says what the silicon is.
"""

from __future__ import annotations


def matmul_tflops(n: int = 8192, iters: int = 20, dtype: str = "bfloat16") -> dict:
    """Median-free best-effort TFLOPS of ``iters`` back-to-back n×n×n matmuls on cuda:0."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("matmul_tflops needs a CUDA device; none is visible to torch")
    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device="cuda", dtype=dt)
    b = torch.randn(n, n, device="cuda", dtype=dt)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "tflops": 2 * n**3 * iters / seconds / 1e12,
        "sms": props.multi_processor_count,
        "memory_gib": props.total_memory / 2**30,
        "n": n,
        "iters": iters,
    }
