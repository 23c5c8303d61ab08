// The calling thread's ggml compute threads.
//
// ggml's CPU backend runs each graph on an OpenMP team, and libgomp keeps one
// pool of worker threads per thread that ever computed. Once the process holds
// more pooled threads than CPUs, libgomp cuts every worker's spin-wait to ~100
// iterations, so each barrier of every graph sleeps and wakes through futexes:
// on 2 cores a second idle pool (another Llama's engine thread, or the main
// thread after one direct pair call) made decoding many times slower.
#pragma once

namespace pydflash {

// Free the calling thread's OpenMP pool (omp_pause_resource_all); its next
// graph starts a new one (too dear for every step).
// False where ggml runs without libgomp. Never call it inside a graph's compute.
bool release_compute_threads();

}  // namespace pydflash
