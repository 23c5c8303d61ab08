// How a part of the pair (the drafter, the acceptor) reports a llama.cpp call
// that failed mid-step: the caches are then in an unknown state, so the pair
// resets every one of them and throws DecodeError (or Interrupted).
#pragma once

#include <cstdint>
#include <string>

namespace pydflash {

class DecodeFailure {
public:
    [[noreturn]] virtual void fail_decode(const std::string& what, int32_t rc) = 0;

protected:
    ~DecodeFailure() = default;
};

}  // namespace pydflash
