// A draft source: what proposes the tokens a step verifies. ContextPair drives
// every source through this one interface and knows none of them; DraftSources
// (draft_sources.h) holds them in llama.cpp's fixed priority order and fans the
// pair's events out to them:
// - a sequence's life: begin (its history was replaced), keep_prefix (a prompt
//   cache hit), clear;
// - a step: check, prepare and draft (the first source with a non-empty draft wins
//   a sequence), decoded (the target pass of new tokens), accept, kept (the rows
//   that stay in the target's cache: inject them now or let them wait), commit.
// The sources: external drafts (the caller's tokens), llama.cpp's n-gram types
// (ngram.cpp), the DFlash drafter (dflash_source.cpp) and the MTP head
// (mtp_source.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "acceptor.h"
#include "decode_failure.h"
#include "drafter.h"
#include "fault.h"
#include "llama.h"
#include "model.h"
#include "pair_params.h"
#include "sampler.h"
#include "sequence.h"

namespace pydflash {

// Who drafted: llama.cpp's --spec-type kinds that pydflash runs, and the caller's draft.
enum class DraftKind : uint8_t {
    None,  // nothing drafted
    NgramSimple,
    NgramMapK,
    NgramMapK4v,
    NgramMod,
    NgramCache,
    DraftMtp,
    DraftDFlash,  // DFlash and DFlash2 drafters
    DraftDSpark,
    External,
};

// "" (None), llama.cpp's --spec-type name ("ngram-mod", "draft-dflash", ...), "external".
const char* draft_kind_name(DraftKind kind);
// The kind of a --spec-type name; none for a name pydflash does not draft with ("none", ...).
std::optional<DraftKind> draft_kind_of(const std::string& spec_type);

// One sequence's draft for a step, filled by the first source that drafts for it.
struct DraftRequest {
    int32_t seq = 0;
    Sequence* s = nullptr;
    const DraftControl* control = nullptr;
    const std::vector<llama_token>* external = nullptr;  // the caller's draft, verified as given
    int32_t n_external = 0;                              // ... of which this many fit the context
    int32_t block = 0;  // the model drafter's block asked for (0: no model pass for this sequence)
    std::vector<llama_token> draft;
    std::vector<Distribution> q;       // the drafter's distribution per token (rejection sampling); empty: one-hot
    DraftKind kind = DraftKind::None;  // who drafted (set even for an empty external draft)
    int32_t by = -1;                   // the registry's index of that source

    bool open() const { return kind == DraftKind::None; }             // no source has drafted for it yet
    int32_t rows() const { return 1 + std::max(block, n_external); }  // its planned verification rows
};

// The requests of one step's drafting, and the room each has in the verification pass.
class DraftRound {
public:
    DraftRound(std::vector<DraftRequest*> reqs, int32_t n_rows, int32_t n_batch, int32_t n_ctx_seq)
        : reqs_(std::move(reqs)), n_rows_(n_rows), n_batch_(n_batch), n_ctx_seq_(n_ctx_seq) {}

    const std::vector<DraftRequest*>& requests() const { return reqs_; }
    // positions left in the sequence's context after its pending token
    int32_t context_room(const DraftRequest& r) const { return n_ctx_seq_ - r.s->n_past - 1; }
    // The most tokens `r` may draft in place of its planned rows: its context, the
    // batch beside the others' rows, and its budget.
    int32_t room(const DraftRequest& r) const;
    // `r`'s draft from a source without a model pass: its block is not needed.
    void take(DraftRequest& r, std::vector<llama_token> draft, DraftKind kind);

private:
    std::vector<DraftRequest*> reqs_;
    int32_t n_rows_;  // the verification pass's rows as planned so far
    int32_t n_batch_;
    int32_t n_ctx_seq_;
};

// Consecutive rows of one sequence in the target pass just decoded: rows row0.. hold
// `first`, then rest[0], rest[1], ... at positions pos0...
struct TargetRows {
    int32_t seq;
    int32_t row0;
    int32_t n;
    llama_pos pos0;
    llama_token first;
    const llama_token* rest;
    bool wait;  // the rows' features may wait for the sequence's next model pass (deferred injection)
};

// What the pair drafts with, as the bindings read it (fixed at creation).
struct DraftInfo {
    std::vector<DraftKind> sources;     // in llama.cpp's priority order (external first)
    DraftKind model = DraftKind::None;  // the model drafter's kind (its block sizes rollback planes)
    std::string kind;                   // "dflash", "dflash2", "dspark", "mtp"; "": none
    std::string description;            // "dflash2 (selector top-k 4)", "mtp (... draft length 3)"
    std::string identity = "none";      // what a slot file names as the drafter
    bool has_drafter = false;           // a drafter file is loaded
    int32_t block_size = 0;
    int32_t max_draft = 0;          // the longest model draft (a DFlash block, the MTP head's length)
    int32_t default_draft_max = 0;  // the block a step asks for by default (0: none)
    int32_t pass_rows = 0;          // rows of one sequence's drafter pass; 0: no pass of fixed size
    int32_t window = 0;             // positions before a block the drafter sees; 0: all
    DraftSpec spec;                 // the DFlash drafter's (a default one without)
};

// The target as a source sees it once its context exists (before the first decode).
struct TargetLink {
    const Model& model;
    llama_context* ctx;
    const PairParams& params;  // the pair's, batch sizes grown for the drafts
    Acceptor& rules;           // the grammar mask a drafted block is walked under
    DecodeFailure& fail;       // a llama.cpp call that failed mid-step: reset the pair and throw
    FaultPlan& fault;          // tests only
};

class DraftSource {
public:
    virtual ~DraftSource() = default;

    // Creation, after every source has checked its settings: its own contexts.
    virtual void attach(const TargetLink& /*target*/) {}
    // Frees what attach made (the pair is closed); the settings stay for describe and check.
    virtual void detach() {}
    virtual void describe(DraftInfo& info) const = 0;           // adds its kinds and what it is
    virtual llama_context* context() const { return nullptr; }  // its llama.cpp context; null: none

    // A sequence's history was replaced (a prefill, a loaded slot).
    virtual void begin(int32_t /*seq*/, const std::vector<llama_token>& /*history*/) {}
    // A prompt-cache hit keeps positions < common of `seq` (with `cut`, later ones leave);
    // `defer`: the prompt's rows will wait. False: llama.cpp refused a removal.
    virtual bool keep_prefix(int32_t /*seq*/, llama_pos /*common*/, bool /*cut*/, bool /*defer*/) { return true; }
    virtual void clear() {}  // every sequence
    virtual void clear(int32_t /*seq*/) {}
    virtual void sync(int32_t /*seq*/) {}                           // before a slot save: hold every kept row
    virtual int32_t n_waiting(int32_t /*seq*/) const { return 0; }  // rows whose features wait

    // A step. InvalidArgument unless the request suits the source, before any work.
    virtual void check(const DraftRequest& /*r*/) const {}
    // Before drafting: what this source's drafts need first (features that waited).
    virtual void prepare(DraftRound& /*round*/) {}
    // Drafts for the open requests it serves (a model source: those with a block).
    virtual void draft(DraftRound& round) = 0;
    // The target pass just decoded these new tokens (prompt or verification, not a
    // replay). True: the source worked on them.
    virtual bool decoded(const std::vector<TargetRows>& /*rows*/) { return false; }
    // These rows stay in the target's cache (prompt, accepted, replayed). True: it worked on them.
    virtual bool kept(const std::vector<TargetRows>& /*rows*/) { return false; }
    // n_accepted of the step's draft were kept; `mine`: this source made the sequence's last draft.
    virtual void accept(int32_t /*seq*/, int32_t /*n_accepted*/, bool /*mine*/) {}
    // The step of `r` is committed: the sequence's cache ends at n_past.
    virtual void commit(const DraftRequest& /*r*/, llama_pos /*n_past*/) {}

    // Calibration (calibrate.cpp): the sizes of this source's model pass to time
    // (empty: none), and one timed pass of `rows` on the empty sequence `seq` (ms).
    virtual std::vector<int32_t> calibration_rows(int32_t /*max_rows*/) const { return {}; }
    virtual double timed_pass(int32_t /*seq*/, int32_t /*rows*/) { return 0.0; }
};

}  // namespace pydflash
