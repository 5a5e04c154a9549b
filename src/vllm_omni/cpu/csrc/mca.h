// The body of an inner loop, marked for LLVM's llvm-mca (vllm_omni.cpu.loop_analysis) in the
// builds that define VO_MCA_MARKERS, which are compiled to assembly for analysis and never
// assembled or run ('#' starts the marks llvm-mca reads on x86 and on AArch64 alike).

#pragma once

#if defined(VO_MCA_MARKERS)
#define VO_MCA_BEGIN(name) asm volatile("# LLVM-MCA-BEGIN " name)
#define VO_MCA_END() asm volatile("# LLVM-MCA-END")
#else
#define VO_MCA_BEGIN(name)
#define VO_MCA_END()
#endif
