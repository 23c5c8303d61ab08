#include "options.h"

#include <algorithm>

#include "errors.h"

namespace pydflash {
namespace {

template <class T>
using Named = std::pair<const char*, T>;

// llama.cpp's KV cache types (its -ctk/-ctv names)
const Named<ggml_type> kCacheTypes[] = {
    {"f32", GGML_TYPE_F32},       {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
    {"q8_0", GGML_TYPE_Q8_0},     {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
    {"iq4_nl", GGML_TYPE_IQ4_NL}, {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1},
};
const Named<llama_flash_attn_type> kFlashAttn[] = {
    {"auto", LLAMA_FLASH_ATTN_TYPE_AUTO},
    {"on", LLAMA_FLASH_ATTN_TYPE_ENABLED},
    {"off", LLAMA_FLASH_ATTN_TYPE_DISABLED},
};
const Named<llama_split_mode> kSplitModes[] = {
    {"none", LLAMA_SPLIT_MODE_NONE},
    {"layer", LLAMA_SPLIT_MODE_LAYER},
    {"row", LLAMA_SPLIT_MODE_ROW},
};

template <class T, size_t N>
std::vector<std::string> names(const Named<T> (&table)[N]) {
    std::vector<std::string> out;
    for (const auto& [name, value] : table) out.emplace_back(name);
    return out;
}

template <class T, size_t N>
T parse(const std::string& option, const std::string& name, const Named<T> (&table)[N]) {
    for (const auto& [n, value] : table) {
        if (name == n) return value;
    }
    check_choice(option, name);  // throws with the list
    throw InvalidArgument(option + ": no table entry for '" + name + "'");
}

}  // namespace

const ChoiceTable& option_choices() {
    static const ChoiceTable table = {
        {"cache_type", names(kCacheTypes)},
        {"flash_attn", names(kFlashAttn)},
        {"split_mode", names(kSplitModes)},
        // "auto", then the RollbackKind names (rollback.h)
        {"rollback", {"auto", "kv-trim", "recurrent-planes", "checkpoint"}},
        {"verify", {"rejection", "match", "coupled"}},  // VerifyMode (sampler.h)
    };
    return table;
}

void check_choice(const std::string& option, const std::string& value) {
    // the four KV cache options share one list
    const bool cache = option.size() >= 6 && (option.compare(option.size() - 6, 6, "type_k") == 0 ||
                                              option.compare(option.size() - 6, 6, "type_v") == 0);
    const std::string key = cache ? "cache_type" : option;
    const auto& table = option_choices();
    const auto it = std::find_if(table.begin(), table.end(), [&](const auto& row) { return row.first == key; });
    if (it == table.end()) throw Error("no choice table for option '" + option + "'");
    const auto& allowed = it->second;
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "'" : ", '") + a + "'";
    throw InvalidArgument(option + " must be one of " + list + ", got '" + value + "'");
}

ggml_type parse_cache_type(const std::string& option, const std::string& name) {
    return parse(option, name, kCacheTypes);
}

llama_flash_attn_type parse_flash_attn(const std::string& name) { return parse("flash_attn", name, kFlashAttn); }

llama_split_mode parse_split_mode(const std::string& name) { return parse("split_mode", name, kSplitModes); }

}  // namespace pydflash
