#include "backend_dl.h"

#include <mutex>

#include "backend.h"
#include "ggml-backend.h"
#include "ggml.h"

#ifdef GGML_BACKEND_DL
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#endif

namespace pydflash {
namespace {

std::mutex g_mutex;
bool g_done = false;
std::vector<BackendLoad> g_report;

// What ggml has registered now; `known` entries (with paths and errors) first.
std::vector<BackendLoad> registry_report(const std::vector<BackendLoad>& known) {
    std::vector<BackendLoad> out = known;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        ggml_backend_reg_t reg = ggml_backend_reg_get(i);
        if (reg == nullptr) continue;
        const std::string name = ggml_backend_reg_name(reg);
        bool seen = false;
        for (const auto& b : out) seen = seen || (b.loaded && b.name == name);
        if (seen) continue;
        BackendLoad b;
        b.name = name;
        b.loaded = true;
        b.n_devices = ggml_backend_reg_dev_count(reg);
        out.push_back(b);
    }
    return out;
}

// g_report (under g_mutex) with device counts as they are now: an RPC backend
// gains devices when a model connects to its servers.
std::vector<BackendLoad> current_report() {
    std::vector<BackendLoad> out = g_report;
    for (auto& b : out) {
        if (!b.loaded) continue;
        if (ggml_backend_reg_t reg = ggml_backend_reg_by_name(b.name.c_str()))
            b.n_devices = ggml_backend_reg_dev_count(reg);
    }
    return registry_report(out);
}

#ifdef GGML_BACKEND_DL
namespace fs = std::filesystem;

// ggml_backend_load_all_from_path's order (ggml-backend-reg.cpp); CPU last.
const char* const kFamilies[] = {"blas",   "zendnn",  "cann",   "cuda",    "hip",  "metal",    "rpc", "sycl",
                                 "vulkan", "virtgpu", "opencl", "hexagon", "musa", "openvino", "cpu"};

// llama.cpp's messages while loading (info and above), kept instead of printed.
std::mutex g_capture_mutex;
std::string g_capture;

void capture_log(ggml_log_level level, const char* text, void*) {
    if (text == nullptr || level == GGML_LOG_LEVEL_DEBUG) return;
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    g_capture += text;
}

std::string take_capture() {
    std::lock_guard<std::mutex> lock(g_capture_mutex);
    std::string out;
    out.swap(g_capture);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

using score_fn = int (*)();

// One backend family in the folder: its module files, and the one to load.
struct Candidate {
    bool present = false;  // some libggml-<family>[-variant].so is there
    fs::path path;         // what to load; empty if no variant suits this machine
    std::string notes;     // why variants were passed over
};

// The best of a family's variants (libggml-cpu-haswell.so, ...) by their own score,
// as ggml_backend_load_best does, else the plain libggml-<family>.so.
Candidate pick(const fs::path& dir, const std::string& family) {
    Candidate c;
    const std::string prefix = "libggml-" + family + "-";
    std::error_code ec;
    std::vector<fs::path> variants;
    for (fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end; !ec && it != end;
         it.increment(ec)) {
        const std::string fname = it->path().filename().string();
        if (fname.rfind(prefix, 0) == 0 && it->path().extension() == ".so") variants.push_back(it->path());
    }
    std::sort(variants.begin(), variants.end());
    int best_score = 0;
    for (const auto& p : variants) {
        c.present = true;
        void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            const char* e = dlerror();
            c.notes += std::string(c.notes.empty() ? "" : "; ") + (e ? e : "cannot load " + p.string());
            continue;
        }
        auto score = reinterpret_cast<score_fn>(dlsym(h, "ggml_backend_score"));
        const int s = score ? score() : 0;
        if (s > best_score) {
            best_score = s;
            c.path = p;
        }
        dlclose(h);
    }
    if (!c.path.empty()) return c;
    const fs::path plain = dir / ("libggml-" + family + ".so");
    if (fs::exists(plain, ec)) {
        c.present = true;
        c.path = plain;
    } else if (c.present && c.notes.empty()) {
        c.notes = "no variant of this backend supports this machine";
    }
    return c;
}

std::vector<BackendLoad> load_from(const std::string& dir) {
    std::vector<BackendLoad> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
        BackendLoad b;
        b.name = "*";
        b.path = dir;
        b.error = "backend folder not found: " + dir;
        out.push_back(b);
        return out;
    }
    ggml_log_callback prev_cb = nullptr;
    void* prev_ud = nullptr;
    ggml_log_get(&prev_cb, &prev_ud);
    ggml_log_set(capture_log, nullptr);
    for (const char* family : kFamilies) {
        const Candidate c = pick(dir, family);
        if (!c.present) continue;
        BackendLoad b;
        b.name = family;
        if (c.path.empty()) {
            b.error = c.notes;
            out.push_back(b);
            continue;
        }
        b.path = c.path.string();
        take_capture();
        ggml_backend_reg_t reg = ggml_backend_load(b.path.c_str());
        const std::string log = take_capture();
        if (reg == nullptr) {
            b.error = !log.empty() ? log : (!c.notes.empty() ? c.notes : "ggml_backend_load failed");
        } else {
            b.loaded = true;
            b.name = ggml_backend_reg_name(reg);
            b.n_devices = ggml_backend_reg_dev_count(reg);
            if (b.n_devices == 0) b.error = !log.empty() ? log : "the backend found no device";
        }
        out.push_back(b);
    }
    ggml_log_set(prev_cb, prev_ud);
    return out;
}
#endif

}  // namespace

bool dynamic_backends() {
#ifdef GGML_BACKEND_DL
    return true;
#else
    return false;
#endif
}

std::vector<BackendLoad> load_backends(const std::string& dir) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_done) return current_report();
    std::vector<BackendLoad> loaded;
#ifdef GGML_BACKEND_DL
    // Skip loading if something registered backends already (ggml_backend_load_all
    // through an earlier llama_backend_init): loading twice would duplicate devices.
    if (ggml_backend_reg_count() == 0) loaded = load_from(dir);
#else
    (void)dir;
#endif
    // Sets pydflash's log sink; llama_backend_init loads nothing more when a
    // backend is registered (with none it tries ggml's default search, silently).
    ensure_backend();
    g_report = registry_report(loaded);
    g_done = true;
    return g_report;
}

std::vector<BackendLoad> backend_load_report() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_done ? current_report() : registry_report({});
}

}  // namespace pydflash
