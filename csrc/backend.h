// Process-wide llama.cpp state: backend initialisation and the log sink.
//
// llama.cpp logs from any thread (ggml workers included), so messages are queued
// here under a mutex and the Python layer drains them into `logging`; calling
// into Python from the callback could deadlock against a thread holding the GIL.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pydflash {

// Initialise llama.cpp's backends once per process (idempotent, thread-safe).
void ensure_backend();

// llama.cpp's NUMA placement (ggml_numa_strategy: 0 off, 1 distribute, 2 isolate, 3 numactl,
// 4 mirror), set once per process as llama.cpp allows; a later call changes nothing and
// returns the strategy in force. InvalidArgument outside 0..4.
int init_numa(int strategy);

// ggml_log_level values: 1 debug, 2 info, 3 warn, 4 error. Messages below
// `level` are dropped before they are queued.
void set_log_level(int level);
int log_level();

// Take the queued log lines (level, text) out of the sink.
std::vector<std::pair<int, std::string>> drain_logs();

// Errors logged by llama.cpp on this thread since the last call; used to give
// load failures a precise reason ("unknown model architecture: ...").
std::string take_thread_errors();

}  // namespace pydflash
