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
std::vector<int32_t> calibration_sizes(int32_t max_rows);

}  // namespace pydflash
