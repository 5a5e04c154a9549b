"""GPU path: the talker and code predictor with static KV caches for CUDA-graph capture,
and the child process that times them under an MPS SM cap.

Kept free of torch imports so that ``import vllm_omni.gpu`` stays cheap; the submodules
import torch themselves.
"""
