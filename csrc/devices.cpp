#include "devices.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "backend.h"
#include "errors.h"
#include "ggml-rpc.h"

#ifndef _WIN32
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#endif

namespace pydflash {
namespace {

std::atomic<bool> g_rpc_registered{false};
std::mutex g_rpc_mutex;
std::set<std::string> g_rpc_endpoints;  // connected once; ggml keeps one connection each

const char* device_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "other";
    }
}

// Through the registry, not ggml-rpc.h: with dynamic backends (the CUDA
// build) RPC is a loadable module whose symbols are not linked in.
template <typename Fn>
Fn rpc_function(const char* name) {
    ensure_backend();
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (reg == nullptr) throw InvalidArgument("this build of pydflash has no RPC backend (GGML_RPC)");
    auto fn = reinterpret_cast<Fn>(ggml_backend_reg_get_proc_address(reg, name));
    if (fn == nullptr) throw Error(std::string("the RPC backend has no ") + name);
    return fn;
}

bool is_rpc(ggml_backend_dev_t dev) {
    const std::string reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    return reg.rfind("RPC", 0) == 0;
}

#ifndef _WIN32
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

bool send_all(int fd, const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        p += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

// Why a read came up short, worded for the user: a timeout, the peer hanging
// up, or the socket error. Empty when all n bytes arrived.
std::string recv_all(int fd, void* data, size_t n) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
        const ssize_t k = ::recv(fd, p, n, 0);
        if (k == 0) return "closed the connection";
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return "timeout";
            return std::strerror(errno);
        }
        p += k;
        n -= static_cast<size_t>(k);
    }
    return {};
}

// ggml's RPC client aborts the process when it cannot connect or the peer
// does not answer its HELLO, so pydflash says that same HELLO first, with
// timeouts (wire format and version: ggml-rpc.cpp, protocol v7).
void probe_rpc_server(const std::string& endpoint) {
    const auto colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0) {
        throw InvalidArgument("RPC server '" + endpoint + "' is not host:port");
    }
    const std::string host = endpoint.substr(0, colon), port = endpoint.substr(colon + 1);
    const std::string where = "RPC server " + endpoint + ": ";
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
        throw ModelLoadError(where + "cannot resolve it (" + gai_strerror(rc) + ")");
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addrs(res, &::freeaddrinfo);
    Fd s;
    std::string why = "no address";
    for (addrinfo* a = res; a != nullptr && s.fd < 0; a = a->ai_next) {
        Fd c;
        c.fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
        if (c.fd < 0) continue;
        if (::connect(c.fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            why = std::strerror(errno);
            continue;
        }
        pollfd pfd{c.fd, POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof(err);
        if (::poll(&pfd, 1, 5000) != 1) {
            why = "no answer within 5 s";
            continue;
        }
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            why = std::strerror(err);
            continue;
        }
        std::swap(s.fd, c.fd);
    }
    if (s.fd < 0) throw ModelLoadError(where + "cannot connect (" + why + ")");
    const int flags = ::fcntl(s.fd, F_GETFL, 0);
    ::fcntl(s.fd, F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{10, 0};
    ::setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(s.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    constexpr uint8_t kHello = 14;
    constexpr uint64_t kCapsSize = 24;  // RPC_CONN_CAPS_SIZE: zero caps = plain TCP
    // One write: a peer that reads once and hangs up must see the whole HELLO,
    // or its close resets the connection before its answer can be read.
    uint8_t hello[1 + sizeof(kCapsSize) + kCapsSize] = {kHello};
    std::memcpy(hello + 1, &kCapsSize, sizeof(kCapsSize));
    const std::string busy =
        "no RPC handshake within 10 s (not an RPC server, or busy serving another client: a "
        "ggml RPC server takes one client at a time)";
    if (!send_all(s.fd, hello, sizeof(hello))) {
        throw ModelLoadError(where + (errno == EAGAIN || errno == EWOULDBLOCK ? busy : std::strerror(errno)));
    }
    const std::string not_rpc =
        "answered, but not as a ggml RPC server (protocol v" + std::to_string(RPC_PROTO_MAJOR_VERSION) + ")";
    uint64_t size = 0;
    uint8_t rsp[4 + kCapsSize] = {};
    if (const std::string e = recv_all(s.fd, &size, sizeof(size)); !e.empty()) {
        throw ModelLoadError(where +
                             (e == "timeout" ? busy : e + " during the RPC handshake (not a ggml RPC server?)"));
    }
    if (size != sizeof(rsp) || !recv_all(s.fd, rsp, sizeof(rsp)).empty()) throw ModelLoadError(where + not_rpc);
    if (rsp[0] != RPC_PROTO_MAJOR_VERSION || rsp[1] > RPC_PROTO_MINOR_VERSION) {
        throw ModelLoadError(where + "speaks RPC protocol v" + std::to_string(rsp[0]) + "." + std::to_string(rsp[1]) +
                             "; this build speaks v" + std::to_string(RPC_PROTO_MAJOR_VERSION) + "." +
                             std::to_string(RPC_PROTO_MINOR_VERSION) + " (use a server built from the same llama.cpp)");
    }
}
#else
void probe_rpc_server(const std::string&) {}
#endif

}  // namespace

std::vector<DeviceInfo> list_devices() {
    ensure_backend();
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (dev == nullptr) continue;
        DeviceInfo d;
        d.name = ggml_backend_dev_name(dev);
        d.description = ggml_backend_dev_description(dev);
        d.type = device_type_name(ggml_backend_dev_type(dev));
        d.backend = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
        // an RPC device's memory is a network call, which aborts in ggml's
        // client if the server has gone: report 0 rather than ask
        if (!is_rpc(dev)) ggml_backend_dev_memory(dev, &d.memory_free, &d.memory_total);
        out.push_back(std::move(d));
    }
    return out;
}

bool rpc_available() {
    ensure_backend();
    return ggml_backend_reg_by_name("RPC") != nullptr;
}

std::vector<ggml_backend_dev_t> rpc_devices(const std::vector<std::string>& endpoints) {
    std::vector<ggml_backend_dev_t> out;
    if (endpoints.empty()) return out;
    using add_server_t = ggml_backend_reg_t (*)(const char*);
    const auto add_server = rpc_function<add_server_t>("ggml_backend_rpc_add_server");
    std::lock_guard<std::mutex> lock(g_rpc_mutex);
    for (const auto& ep : endpoints) {
        if (!g_rpc_endpoints.count(ep)) probe_rpc_server(ep);
        take_thread_errors();
        ggml_backend_reg_t reg = add_server(ep.c_str());  // cached per endpoint by ggml
        if (reg == nullptr) {
            const std::string why = take_thread_errors();
            throw ModelLoadError("cannot reach the RPC server at " + ep + (why.empty() ? "" : ": " + why));
        }
        bool known = false;
        for (size_t i = 0; i < ggml_backend_reg_count(); ++i) known = known || ggml_backend_reg_get(i) == reg;
        if (!known) ggml_backend_register(reg);
        g_rpc_endpoints.insert(ep);
        g_rpc_registered = true;
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) out.push_back(ggml_backend_reg_dev_get(reg, i));
    }
    return out;
}

std::vector<ggml_backend_dev_t> offload_devices(const std::vector<std::string>& rpc_endpoints) {
    std::vector<ggml_backend_dev_t> devs = rpc_devices(rpc_endpoints);  // remote first, as llama.cpp does
    if (!g_rpc_registered) return {};                                   // llama.cpp's default selection is right
    std::vector<ggml_backend_dev_t> igpus;
    bool gpu = false;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (is_rpc(dev)) continue;
        const auto t = ggml_backend_dev_type(dev);
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU) {
            devs.push_back(dev);
            gpu = true;
        } else if (t == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            igpus.push_back(dev);
        }
    }
    if (!gpu) devs.insert(devs.end(), igpus.begin(), igpus.end());
    devs.push_back(nullptr);
    return devs;
}

void serve_rpc(const std::string& endpoint, int n_threads, const std::string& cache_dir) {
    using start_server_t = void (*)(const char*, const char*, size_t, size_t, ggml_backend_dev_t*);
    const auto start_server = rpc_function<start_server_t>("ggml_backend_rpc_start_server");
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) throw Error("no CPU device to serve");
    if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(), static_cast<size_t>(n_threads), 1,
                 &cpu);
}

}  // namespace pydflash
