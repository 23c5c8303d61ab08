// Test-only fault injection: make the Nth later call at one site fail, so the
// tests can prove that DecodeError / RollbackError reset the pair. Off unless
// armed through ContextPair::inject_fault (Python: ContextPair._inject_fault).
#pragma once

#include <cstdint>
#include <string>

#include "errors.h"

namespace pydflash {

enum class FaultSite { None, TargetDecode, DrafterDecode, MemoryRemove, GrammarMask };

struct FaultPlan {
    FaultSite site = FaultSite::None;
    int32_t after_calls = 0;  // calls at `site` that still succeed before the one that fails

    // "target_decode", "drafter_decode" (block and feature decodes),
    // "memory_remove" (removing rejected tokens from the target), "grammar_mask"
    // (a grammar mask's stop check says stop), or "none".
    void arm(const std::string& name, int32_t after) {
        if (after < 0) throw InvalidArgument("after_calls must be >= 0");
        if (name == "none") {
            site = FaultSite::None;
        } else if (name == "target_decode") {
            site = FaultSite::TargetDecode;
        } else if (name == "drafter_decode") {
            site = FaultSite::DrafterDecode;
        } else if (name == "memory_remove") {
            site = FaultSite::MemoryRemove;
        } else if (name == "grammar_mask") {
            site = FaultSite::GrammarMask;
        } else {
            throw InvalidArgument("unknown fault site '" + name +
                                  "' (target_decode, drafter_decode, memory_remove, grammar_mask, none)");
        }
        after_calls = after;
    }

    // True when this call at `s` must fail; fires once, then disarms.
    bool fire(FaultSite s) {
        if (site == FaultSite::None || site != s) return false;
        if (after_calls > 0) {
            --after_calls;
            return false;
        }
        site = FaultSite::None;
        return true;
    }
};

}  // namespace pydflash
