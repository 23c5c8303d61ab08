// Linked into the native llama-speculative-simple that tools/build_native.py
// builds: llama.cpp's logger writes from a worker thread and is never flushed
// at exit (upstream issue 22142), so on a loaded machine the last lines, the
// run's figures among them, were lost. This object's destructor runs at exit
// and joins that thread once it has written everything queued. The loop
// itself is untouched.
#include "log.h"

namespace {
struct flush_log_at_exit {
    ~flush_log_at_exit() { common_log_pause(common_log_main()); }
} flush_at_exit;
}  // namespace
