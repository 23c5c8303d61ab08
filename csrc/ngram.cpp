#include "ngram.h"

#include <algorithm>
#include <set>

#include "common.h"
#include "draft_sources.h"
#include "errors.h"
#include "speculative.h"

namespace pydflash {
namespace {

const common_params_speculative& llama_defaults() {
    static const common_params_speculative d;
    return d;
}

void in_range(const char* name, int32_t v, int32_t lo, int32_t hi) {
    if (v < lo || v > hi) {
        throw InvalidArgument(std::string("ngram ") + name + " must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got " + std::to_string(v));
    }
}

common_params_speculative to_llama(const NgramParams& p, common_speculative_type type) {
    common_params_speculative c;
    c.types = {type};
    c.ngram_mod.n_match = p.mod_n_match;
    c.ngram_mod.n_min = p.mod_n_min;
    c.ngram_mod.n_max = p.mod_n_max;
    c.ngram_simple.size_n = static_cast<uint16_t>(p.simple_size_n);
    c.ngram_simple.size_m = static_cast<uint16_t>(p.simple_size_m);
    c.ngram_map_k.size_n = static_cast<uint16_t>(p.map_k_size_n);
    c.ngram_map_k.size_m = static_cast<uint16_t>(p.map_k_size_m);
    c.ngram_map_k.min_hits = static_cast<uint16_t>(p.map_k_min_hits);
    c.ngram_map_k4v.size_n = static_cast<uint16_t>(p.map_k4v_size_n);
    c.ngram_map_k4v.size_m = static_cast<uint16_t>(p.map_k4v_size_m);
    c.ngram_map_k4v.min_hits = static_cast<uint16_t>(p.map_k4v_min_hits);
    return c;
}

}  // namespace

NgramParams::NgramParams() {
    const common_params_speculative& d = llama_defaults();
    mod_n_match = d.ngram_mod.n_match;
    mod_n_min = d.ngram_mod.n_min;
    mod_n_max = d.ngram_mod.n_max;
    simple_size_n = d.ngram_simple.size_n;
    simple_size_m = d.ngram_simple.size_m;
    map_k_size_n = d.ngram_map_k.size_n;
    map_k_size_m = d.ngram_map_k.size_m;
    map_k_min_hits = d.ngram_map_k.min_hits;
    map_k4v_size_n = d.ngram_map_k4v.size_n;
    map_k4v_size_m = d.ngram_map_k4v.size_m;
    map_k4v_min_hits = d.ngram_map_k4v.min_hits;
}

void NgramParams::validate() const {
    // llama.cpp's argument ranges (common/arg.cpp)
    in_range("mod_n_match", mod_n_match, 1, 1024);
    in_range("mod_n_min", mod_n_min, 0, 1024);
    in_range("mod_n_max", mod_n_max, 0, 1024);
    if (mod_n_min > mod_n_max) {
        throw InvalidArgument("ngram mod_n_min " + std::to_string(mod_n_min) + " exceeds mod_n_max " +
                              std::to_string(mod_n_max));
    }
    in_range("simple_size_n", simple_size_n, 1, 1024);
    in_range("simple_size_m", simple_size_m, 1, 1024);
    in_range("map_k_size_n", map_k_size_n, 1, 1024);
    in_range("map_k_size_m", map_k_size_m, 1, 1024);
    in_range("map_k_min_hits", map_k_min_hits, 1, 65535);
    in_range("map_k4v_size_n", map_k4v_size_n, 1, 1024);
    in_range("map_k4v_size_m", map_k4v_size_m, 1, 1024);
    in_range("map_k4v_min_hits", map_k4v_min_hits, 1, 65535);
}

const std::vector<std::string>& speculative_type_names() {
    static const std::vector<std::string> names = {
        "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",    "ngram-cache", "draft-simple",
        "draft-eagle3", "draft-mtp",   "draft-dflash",  "draft-dspark", "none",
    };
    return names;
}

bool is_ngram_type(const std::string& name) { return name.rfind("ngram-", 0) == 0; }

void check_speculative_types(const std::vector<std::string>& names) {
    const auto& known = speculative_type_names();
    std::set<std::string> seen;
    for (const std::string& n : names) {
        if (std::find(known.begin(), known.end(), n) == known.end()) {
            std::string all;
            for (const auto& k : known) all += (all.empty() ? "'" : ", '") + k + "'";
            throw InvalidArgument("speculative type '" + n + "' is unknown; llama.cpp's names are " + all);
        }
        if (!seen.insert(n).second) throw InvalidArgument("speculative type '" + n + "' is listed twice");
        if (n == "draft-simple" || n == "draft-eagle3") {
            throw InvalidArgument("speculative type '" + n +
                                  "' is not supported by pydflash; use 'draft-dflash' with a DFlash drafter "
                                  "(draft=...), 'draft-mtp' with a target that has an MTP head, and/or the "
                                  "n-gram types");
        }
        if (n == "none" && names.size() > 1) {
            throw InvalidArgument("speculative type 'none' cannot be combined with other types");
        }
    }
}

NgramDrafters::NgramDrafters(const std::vector<std::string>& types, const NgramParams& params, int32_t n_seq)
    : last_(static_cast<size_t>(n_seq), -1) {  // `params` were checked with the pair's (PairParams::validate)
    // llama.cpp's priority order, whatever the order of `types`
    for (const std::string& name : speculative_type_names()) {
        if (!is_ngram_type(name) || std::find(types.begin(), types.end(), name) == types.end()) continue;
        common_params_speculative c = to_llama(params, common_speculative_type_from_name(name));
        common_speculative* spec = common_speculative_init(c, static_cast<uint32_t>(n_seq));
        if (spec == nullptr) throw Error("llama.cpp could not create the '" + name + "' drafter");
        srcs_.push_back(
            {draft_kind_of(name).value_or(DraftKind::None), std::unique_ptr<common_speculative, Free>(spec)});
    }
}

void NgramDrafters::Free::operator()(common_speculative* spec) const { common_speculative_free(spec); }

NgramDrafters::~NgramDrafters() = default;

void NgramDrafters::describe(DraftInfo& info) const {
    for (const Source& s : srcs_) info.sources.push_back(s.kind);
}

void NgramDrafters::begin(int32_t seq, const std::vector<llama_token>& history) {
    for (Source& s : srcs_) common_speculative_begin(s.spec.get(), seq, history);
}

void NgramDrafters::draft(DraftRound& round) {
    for (DraftRequest* r : round.requests()) {
        if (!r->open()) continue;  // the caller's draft: verify what was given
        const Sequence& s = *r->s;
        DraftKind kind = DraftKind::None;
        std::vector<llama_token> d = draft(r->seq, s.history, *s.pending, s.n_past, round.room(*r), kind);
        if (!d.empty()) round.take(*r, std::move(d), kind);
    }
}

std::vector<llama_token> NgramDrafters::draft(int32_t seq, const std::vector<llama_token>& history, llama_token last,
                                              llama_pos pos0, int32_t n_max, DraftKind& kind) {
    std::vector<llama_token> out;
    if (n_max <= 0) return out;
    for (size_t i = 0; i < srcs_.size(); ++i) {
        common_speculative* spec = srcs_[i].spec.get();
        common_speculative_get_draft_params(spec, seq) = {true, n_max, pos0, last, &history, &out};
        common_speculative_draft(spec);  // truncates to n_max
        if (!out.empty()) {
            last_.at(static_cast<size_t>(seq)) = static_cast<int32_t>(i);
            kind = srcs_[i].kind;
            return out;
        }
    }
    return out;
}

void NgramDrafters::accept(int32_t seq, int32_t n_accepted, bool mine) {
    const int32_t i = last_.at(static_cast<size_t>(seq));
    if (!mine || i < 0) return;
    const auto n = static_cast<uint16_t>(std::clamp(n_accepted, 0, 65535));
    common_speculative_accept(srcs_[static_cast<size_t>(i)].spec.get(), seq, n);
}

std::unique_ptr<DraftSource> make_ngram_source(const std::vector<std::string>& types, const NgramParams& params,
                                               int32_t n_seq) {
    if (std::none_of(types.begin(), types.end(), is_ngram_type)) return nullptr;
    return std::make_unique<NgramDrafters>(types, params, n_seq);
}

}  // namespace pydflash
