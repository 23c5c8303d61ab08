// Coupled sampling (verify="coupled"): the Gumbel-max trick with noise shared by
// the target and every drafter. The noise of token x at absolute position i is a
// pure function of (seed, i, x), so the target's token argmax_x(log p_i(x) + g)
// is an exact sample of p_i that no drafter, draft length or batch can change;
// a drafter proposing argmax_x(log q_i(x) + g) with the same noise agrees with it
// with probability >= (1 - TV) / (1 + TV) (Daliri, Musco and Suresh, 2024).
#pragma once

#include <array>
#include <cstdint>

#include "llama.h"

namespace pydflash {

struct Distribution;

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// 2011): a counter-based generator, the block cipher of `key` applied to `ctr`.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

// Standard Gumbel noise of `token` at absolute position `pos` under `seed`.
double coupled_gumbel(uint64_t seed, llama_pos pos, llama_token token);

// argmax over d's tokens of log d(x) + coupled_gumbel(seed, pos, x): one Philox
// block and two logs per token the sampler chain left (top-k 40: 40; no cut: the
// whole vocabulary, about as much as the chain's own sort of it). Ties: the first.
llama_token coupled_argmax(const Distribution& d, uint64_t seed, llama_pos pos);

}  // namespace pydflash
