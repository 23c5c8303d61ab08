#include "threads.h"

#if defined(__linux__)
#include <dlfcn.h>
#endif

namespace pydflash {

bool release_compute_threads() {
#if defined(__linux__)
    // looked up at run time: libgomp is ggml-cpu's dependency (statically linked
    // into the extension, or a dynamically loaded backend), not this library's;
    // RTLD_NOLOAD finds it only where it is already loaded
    using pause_fn = int (*)(int);
    static const pause_fn pause = [] {
        void* h = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
        return h ? reinterpret_cast<pause_fn>(dlsym(h, "omp_pause_resource_all")) : nullptr;
    }();
    constexpr int kPauseSoft = 1;  // omp_pause_soft: threads go, settings stay
    return pause != nullptr && pause(kPauseSoft) == 0;
#else
    return false;  // libgomp is a Linux build's (others build ggml without it or name it otherwise)
#endif
}

}  // namespace pydflash
