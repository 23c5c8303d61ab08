"""ggml's RPC backend: `pydflash rpc-server` on loopback, a Llama offloading
to it, and the failures that ggml's client would otherwise abort on."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import pydflash
from pydflash import Llama, ModelLoadError
from support.rpc import closed_port, start_server

PROMPT = "def read_lines(path):\n"


@pytest.fixture(scope="module")
def endpoint():
    srv = start_server()
    yield f"127.0.0.1:{srv.port}"
    out = srv.stop()
    assert srv.proc.returncode == 0, out
    assert "Starting RPC server" in out and "Accepted client connection" in out


@pytest.fixture(scope="module")
def pair() -> tuple[str, str]:
    return pydflash.embedded_pair()


def test_rpc_is_built_in():
    assert pydflash._core.rpc_available()


def test_lossless_through_an_rpc_server(pair, endpoint):
    target, draft = pair
    with Llama(target, draft=draft, n_ctx=512) as local:
        ref = local.generate(PROMPT, max_tokens=48, ignore_eos=True).tokens
    with Llama(target, draft=draft, n_ctx=512, rpc_servers=[endpoint], n_gpu_layers=-1) as llm:
        rows = llm.memory().rows
        spec = llm.generate(PROMPT, max_tokens=48, ignore_eos=True, draft_max=llm.pair.max_draft)  # every step drafts
        alone = llm.generate(PROMPT, max_tokens=48, ignore_eos=True, draft_max=0)
    # both models' layers live on the server
    for role in ("target", "drafter"):
        assert any(r.buffer.startswith("RPC") and endpoint in r.buffer and r.model > 0 for r in rows if r.role == role)
    assert spec.tokens == alone.tokens
    assert spec.tokens == ref  # the server runs the same CPU kernels
    assert spec.stats.n_accepted > 0
    assert any(b["backend"] == "RPC" and b["description"] == endpoint for b in pydflash.backends())


def test_models_without_rpc_servers_stay_local(pair, endpoint):
    target, draft = pair
    with Llama(target, draft=draft, n_ctx=256, rpc_servers=endpoint, n_gpu_layers=-1) as remote, \
            Llama(target, draft=draft, n_ctx=256, n_gpu_layers=-1) as local:
        assert any(r.buffer.startswith("RPC") for r in remote.memory().rows)
        assert not any(r.buffer.startswith("RPC") for r in local.memory().rows)
        assert remote.generate(PROMPT, max_tokens=16).tokens == local.generate(PROMPT, max_tokens=16).tokens


SERVER_GONE = """
import signal, subprocess, sys, time
sys.path.insert(0, sys.argv[2])
from support.rpc import start_server
from pydflash import Llama, backends
srv = start_server()
with Llama(sys.argv[3], rpc_servers=[f"127.0.0.1:{srv.port}"], n_gpu_layers=-1, n_ctx=128) as llm:
    llm.generate("x", max_tokens=2)
srv.stop(signal.SIGKILL)
print(sorted(b["name"] for b in backends()))
with Llama(sys.argv[3], n_gpu_layers=-1, n_ctx=128) as llm:
    print(len(llm.generate("x", max_tokens=2, ignore_eos=True).tokens))
"""


def test_a_server_gone_after_use_does_not_break_the_process(pair):
    # asking a dead server for its memory would abort in ggml's client
    out = subprocess.run([sys.executable, "-c", SERVER_GONE, "-", str(Path(__file__).parent), pair[0]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["['CPU', 'RPC0']", "2"], out.stdout


def test_nobody_listening(pair):
    with closed_port() as s:  # refused, as the message says: not a timeout's
        with pytest.raises(ModelLoadError, match=r"RPC server 127\.0\.0\.1:\d+: cannot connect \(Connection refused\)"):
            Llama(pair[0], rpc_servers=[f"127.0.0.1:{s.getsockname()[1]}"], n_gpu_layers=-1)


HELLO_BYTES = 1 + 8 + 24  # command, payload size, connection caps (ggml-rpc.cpp)


def _fake_peer(answer: bytes | None):
    """A TCP peer that reads a whole HELLO, then answers `answer` or hangs up."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            got = b""
            while len(got) < HELLO_BYTES and (chunk := conn.recv(HELLO_BYTES - len(got))):
                got += chunk
            if answer is not None:
                conn.sendall(answer)

    t = threading.Thread(target=serve)
    t.start()
    return srv, t


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((5).to_bytes(8, "little") + b"hello", "answered, but not as a ggml RPC server"),
        (None, "closed the connection during the RPC handshake"),
    ],
    ids=["wrong-answer", "hangs-up"],
)
def test_a_peer_that_is_not_an_rpc_server(pair, answer, message):
    # ggml's own client aborts the process on a failed handshake; pydflash asks first
    srv, t = _fake_peer(answer)
    with srv:
        # told what the peer did (the message names it), not that the 10 s timeout ran out
        with pytest.raises(ModelLoadError, match=message):
            Llama(pair[0], rpc_servers=[f"127.0.0.1:{srv.getsockname()[1]}"], n_gpu_layers=-1)
        t.join()
    with Llama(pair[0], n_ctx=128) as llm:  # the process is fine
        assert len(llm.generate("x", max_tokens=3, ignore_eos=True).tokens) == 3


def test_a_peer_that_reads_one_chunk_and_answers(pair):
    # CI failure of stop 12: a peer that answers after its first recv() and hangs
    # up resets the connection when the HELLO comes in several writes, and the
    # answer is lost; repeated because it was a race
    rounds = 20
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def answer_at_once() -> None:
            for _ in range(rounds):
                conn, _ = srv.accept()
                with conn:
                    conn.recv(64)
                    conn.sendall((5).to_bytes(8, "little") + b"hello")

        t = threading.Thread(target=answer_at_once)
        t.start()
        for _ in range(rounds):
            with pytest.raises(ModelLoadError, match="answered, but not as a ggml RPC server"):
                Llama(pair[0], rpc_servers=[f"127.0.0.1:{srv.getsockname()[1]}"], n_gpu_layers=-1)
        t.join()


def test_server_on_a_busy_port_exits_with_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        out = subprocess.run([sys.executable, "-m", "pydflash", "rpc-server", "--port", str(s.getsockname()[1])],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "Failed to create server socket" in out.stdout + out.stderr
