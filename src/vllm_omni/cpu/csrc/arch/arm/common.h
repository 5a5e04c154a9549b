// What the ARM tile loops share (arch/arm/q4_tile.h, q8_tile.h): NEON with the dot product
// (Armv8.2-A +dotprod), and the activation word broadcast to the four lanes of an SDOT.

#pragma once

#include <arm_neon.h>

namespace {

// The activation word of inputs 4j .. 4j + 3 of a group, in all four lanes.
inline int8x16_t act_lanes(const int8_t* q, int j) { return vreinterpretq_s8_s32(vdupq_n_s32(act_word(q + 4 * j))); }

}  // namespace
