"""``vllm-omni-bench``: benchmarks and generators that write artifacts under ``results/``.

Each subcommand lives in its own module with ``register(subparsers)``; modules import torch
only inside the function that runs, so ``vllm-omni-bench --help`` stays fast.
"""
