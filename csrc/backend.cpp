#include "backend.h"

#include <deque>
#include <mutex>
#include <string>

#include "errors.h"
#include "ggml-backend.h"
#include "llama.h"

namespace pydflash {
namespace {

constexpr size_t kMaxQueued = 4096;

std::mutex g_log_mutex;
std::deque<std::pair<int, std::string>> g_log_queue;
int g_log_level = GGML_LOG_LEVEL_WARN;
thread_local std::string t_errors;
thread_local int t_last_level = GGML_LOG_LEVEL_INFO;

void log_callback(ggml_log_level level, const char* text, void*) {
    if (text == nullptr) return;
    int lvl = level;
    if (level == GGML_LOG_LEVEL_CONT) lvl = t_last_level;  // continuation of the previous line
    t_last_level = lvl;
    if (lvl == GGML_LOG_LEVEL_ERROR) t_errors += text;
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (lvl < g_log_level || lvl == GGML_LOG_LEVEL_NONE) return;
    if (level == GGML_LOG_LEVEL_CONT && !g_log_queue.empty()) {
        g_log_queue.back().second += text;
        return;
    }
    if (g_log_queue.size() >= kMaxQueued) g_log_queue.pop_front();
    g_log_queue.emplace_back(lvl, text);
}

}  // namespace

void ensure_backend() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        llama_backend_init();
    });
}

int init_numa(int strategy) {
    if (strategy < 0 || strategy >= GGML_NUMA_STRATEGY_COUNT) {
        throw InvalidArgument("numa must be a bool or a ggml_numa_strategy in [0, " +
                              std::to_string(GGML_NUMA_STRATEGY_COUNT - 1) + "], got " + std::to_string(strategy));
    }
    static std::once_flag once;
    static int in_force = GGML_NUMA_STRATEGY_DISABLED;
    if (strategy == GGML_NUMA_STRATEGY_DISABLED) return in_force;
    ensure_backend();
    std::call_once(once, [strategy] {
        llama_numa_init(static_cast<ggml_numa_strategy>(strategy));
        in_force = strategy;
    });
    return in_force;
}

void set_log_level(int level) {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log_level = level;
}

int log_level() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    return g_log_level;
}

std::vector<std::pair<int, std::string>> drain_logs() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::vector<std::pair<int, std::string>> out(g_log_queue.begin(), g_log_queue.end());
    g_log_queue.clear();
    return out;
}

std::string take_thread_errors() {
    std::string out;
    out.swap(t_errors);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

}  // namespace pydflash
