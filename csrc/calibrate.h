// What verifying and drafting cost on this machine, model pair and backend:
// the timings an adaptive draft length weighs against the expected tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace pydflash {

struct Calibration {
    std::vector<int32_t> verify_rows;  // target pass sizes timed (rows with logits)
    std::vector<double> verify_ms;     // the median time of each
    std::vector<int32_t> draft_rows;   // drafter block pass sizes timed (anchor + masks); empty: no drafter
    std::vector<double> draft_ms;
    int32_t reps = 0;      // timed passes per size (after one warm-up pass)
    double seconds = 0.0;  // what the calibration took, all passes included
};

// The pass sizes a calibration times: every size up to 16, then steps of about
// a quarter up to `max_rows` (which is always included). Interpolate between them.
// Sizes are interleaved (a slow moment spreads over all of them). Each timed pass
// follows an untimed one of its size, so llama.cpp reuses its graph as in a run of
// steps of one size (the engine learns the cost of a change of size online). A
// target pass of several rows and a drafter pass also follow a pass of the other
// model, as in a drafting step: on a small CPU model each evicts the other's
// weights from the caches (attention over the context the engine learns online).
std::vector<int32_t> calibration_sizes(int32_t max_rows);

}  // namespace pydflash
