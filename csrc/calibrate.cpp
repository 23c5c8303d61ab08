// ContextPair::calibrate: time target passes of 1..max_rows rows and drafter
// block passes on an empty sequence (median of a few passes each), then clear it.
#include "calibrate.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "batch.h"
#include "context_pair.h"
#include "errors.h"

namespace pydflash {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<int32_t> calibration_sizes(int32_t max_rows) {
    std::vector<int32_t> out;
    for (int32_t r = 1; r <= max_rows; r = r < 16 ? r + 1 : r + std::max(1, r / 4)) out.push_back(r);
    if (!out.empty() && out.back() != max_rows) out.push_back(max_rows);
    return out;
}

Calibration ContextPair::calibrate(int32_t seq, int32_t max_rows, int32_t reps) {
    std::lock_guard<std::mutex> lock(mu_);
    require_open();
    const Sequence& s = seq_at(seq);
    if (s.pending || !s.history.empty() || !s.prompt.empty()) {
        throw InvalidArgument("calibrate needs an empty sequence: sequence " + std::to_string(seq) +
                              " holds tokens (reset it first, or calibrate another)");
    }
    if (reps < 1) throw InvalidArgument("reps must be >= 1, got " + std::to_string(reps));
    const int32_t limit = std::min(info_.params.n_batch, n_ctx_seq());
    if (max_rows < 1 || max_rows > limit) {
        throw InvalidArgument("max_rows must be in [1, " + std::to_string(limit) + "] (n_batch and one sequence's " +
                              "context), got " + std::to_string(max_rows));
    }
    const auto t_start = Clock::now();
    llama_memory_t mem_tgt = llama_get_memory(ctx_tgt_.get());
    const llama_token tok = 0;  // any valid id: the cost does not depend on it
    auto target_pass = [&](int32_t rows) {
        llama_batch_ext_clear(batch_tgt_.get());
        for (int32_t i = 0; i < rows; ++i) add_token(batch_tgt_.get(), seq, tok, i, true);
        const auto t0 = Clock::now();
        decode_target_batch();
        const double ms = ms_since(t0);
        llama_memory_seq_rm(mem_tgt, seq, -1, -1);
        return ms;
    };
    auto drafter_pass = [&](int32_t rows) { return sources_->timed_pass(seq, rows); };
    Calibration cal;
    cal.reps = reps;
    cal.verify_rows = calibration_sizes(max_rows);
    cal.draft_rows = sources_->calibration_rows(max_rows);  // empty: no drafter pass of fixed size
    const bool drafter = !cal.draft_rows.empty();
    std::vector<std::vector<double>> tv(cal.verify_rows.size()), td(cal.draft_rows.size());
    target_pass(max_rows);  // warm-up: first-use allocations, caches
    if (drafter) drafter_pass(cal.draft_rows.back());
    // sizes interleaved (see calibrate.h): a timed pass follows an untimed one of its size
    // (llama.cpp reuses its graph) and, for a drafting step's passes, one of the other model
    for (int32_t r = 0; r < reps; ++r) {
        for (size_t i = 0; i < cal.verify_rows.size(); ++i) {
            target_pass(cal.verify_rows[i]);
            if (drafter && cal.verify_rows[i] > 1) drafter_pass(cal.draft_rows.front());  // any size: all weights
            tv[i].push_back(target_pass(cal.verify_rows[i]));
        }
        for (size_t i = 0; i < cal.draft_rows.size(); ++i) {
            drafter_pass(cal.draft_rows[i]);
            target_pass(1);
            td[i].push_back(drafter_pass(cal.draft_rows[i]));
        }
    }
    for (auto& v : tv) cal.verify_ms.push_back(median(v));
    for (auto& v : td) cal.draft_ms.push_back(median(v));
    cal.seconds = ms_since(t_start) / 1e3;
    return cal;
}

}  // namespace pydflash
