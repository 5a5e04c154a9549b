# requires: HAS_CUDA
"""Identify the GPU class by throughput: a bf16 8192³ matmul, 20 iterations."""
from vllm_omni.gpu_probe import matmul_tflops

r = matmul_tflops(n=8192, iters=20)
print(f"{r['device']}: {r['tflops']:.0f} TFLOPS bf16, {r['sms']} SMs, {r['memory_gib']:.0f} GiB")
assert r["tflops"] > 0
