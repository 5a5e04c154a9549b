"""CPU path: random weights, the eager reference talker/predictor, samplers, the frame loop,
and the fused kernels beside them.

Kept free of torch imports so that ``import vllm_omni.cpu`` stays cheap; the submodules
import torch themselves.
"""
