#include "coupled.h"

#include <cmath>
#include <limits>

#include "sampler.h"

namespace pydflash {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            key[0] += kW0;
            key[1] += kW1;
        }
        const uint64_t p0 = kM0 * ctr[0];
        const uint64_t p1 = kM1 * ctr[2];
        ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    }
    return ctr;
}

double coupled_gumbel(uint64_t seed, llama_pos pos, llama_token token) {
    // counter (token, position, 0, 0) under the seed as key: every (seed, i, x) its own block
    const auto out = philox4x32({static_cast<uint32_t>(token), static_cast<uint32_t>(pos), 0u, 0u},
                                {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    const uint64_t bits = (static_cast<uint64_t>(out[0]) << 32 | out[1]) >> 11;  // 53 bits
    const double u = (static_cast<double>(bits) + 0.5) * 0x1.0p-53;              // in (0, 1)
    return -std::log(-std::log(u));
}

llama_token coupled_argmax(const Distribution& d, uint64_t seed, llama_pos pos) {
    llama_token best = d.ids.empty() ? 0 : d.ids[0];
    double best_key = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < d.ids.size(); ++i) {
        if (!(d.probs[i] > 0.0f)) continue;  // underflowed: never the argmax
        const double key = std::log(static_cast<double>(d.probs[i])) + coupled_gumbel(seed, pos, d.ids[i]);
        if (key > best_key) {
            best_key = key;
            best = d.ids[i];
        }
    }
    return best;
}

}  // namespace pydflash
