#!/usr/bin/env python3
"""Write the corpus of crafted malformed GGUF files in tests/data/bad_gguf/.

Each file breaks one thing of a small valid qwen3 target: truncation at every
section boundary, wrong magic or version, absurd counts, offsets, dimensions
and types, sizes that overflow, wrong types for required keys, missing
required keys, string and array lengths past the end of the file. The files
are written byte by byte here (not with a GGUF library) so that any field can
hold any value.

    python tools/make_bad_gguf.py [--out tests/data/bad_gguf]
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

T_U32, T_F32, T_STR, T_ARR, T_U64, T_I32 = 4, 6, 8, 9, 10, 5
GGML_F32 = 0
ALIGN = 32

N_EMBD, N_LAYER, N_HEAD, N_KV, HD, N_FF, N_VOCAB = 16, 1, 2, 1, 8, 32, 8


def s(text: str | bytes, length: int | None = None) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b) if length is None else length) + b


def kv(key: str, typ: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", typ) + payload


def u32(key: str, v: int) -> bytes:
    return kv(key, T_U32, struct.pack("<I", v))


def f32(key: str, v: float) -> bytes:
    return kv(key, T_F32, struct.pack("<f", v))


def string(key: str, v: str) -> bytes:
    return kv(key, T_STR, s(v))


def str_array(key: str, items: list[str]) -> bytes:
    return kv(key, T_ARR, struct.pack("<IQ", T_STR, len(items)) + b"".join(s(i) for i in items))


def i32_array(key: str, items: list[int]) -> bytes:
    return kv(key, T_ARR, struct.pack("<IQ", T_I32, len(items)) + b"".join(struct.pack("<i", i) for i in items))


def base_kvs() -> dict[str, bytes]:
    a = "qwen3"
    toks = [f"<t{i}>" for i in range(N_VOCAB)]
    return {
        "general.architecture": string("general.architecture", a),
        f"{a}.context_length": u32(f"{a}.context_length", 256),
        f"{a}.embedding_length": u32(f"{a}.embedding_length", N_EMBD),
        f"{a}.block_count": u32(f"{a}.block_count", N_LAYER),
        f"{a}.feed_forward_length": u32(f"{a}.feed_forward_length", N_FF),
        f"{a}.attention.head_count": u32(f"{a}.attention.head_count", N_HEAD),
        f"{a}.attention.head_count_kv": u32(f"{a}.attention.head_count_kv", N_KV),
        f"{a}.attention.key_length": u32(f"{a}.attention.key_length", HD),
        f"{a}.attention.value_length": u32(f"{a}.attention.value_length", HD),
        f"{a}.attention.layer_norm_rms_epsilon": f32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "tokenizer.ggml.model": string("tokenizer.ggml.model", "gpt2"),
        "tokenizer.ggml.pre": string("tokenizer.ggml.pre", "qwen2"),
        "tokenizer.ggml.tokens": str_array("tokenizer.ggml.tokens", toks),
        "tokenizer.ggml.token_type": i32_array("tokenizer.ggml.token_type", [1] * N_VOCAB),
        "tokenizer.ggml.merges": str_array("tokenizer.ggml.merges", ["< t"]),
    }


def base_tensors() -> list[tuple[str, tuple[int, ...]]]:
    t = [("token_embd.weight", (N_EMBD, N_VOCAB)), ("output_norm.weight", (N_EMBD,)),
         ("output.weight", (N_EMBD, N_VOCAB))]
    for i in range(N_LAYER):
        t += [(f"blk.{i}.attn_norm.weight", (N_EMBD,)), (f"blk.{i}.attn_q.weight", (N_EMBD, N_HEAD * HD)),
              (f"blk.{i}.attn_k.weight", (N_EMBD, N_KV * HD)), (f"blk.{i}.attn_v.weight", (N_EMBD, N_KV * HD)),
              (f"blk.{i}.attn_output.weight", (N_HEAD * HD, N_EMBD)), (f"blk.{i}.attn_q_norm.weight", (HD,)),
              (f"blk.{i}.attn_k_norm.weight", (HD,)), (f"blk.{i}.ffn_norm.weight", (N_EMBD,)),
              (f"blk.{i}.ffn_gate.weight", (N_EMBD, N_FF)), (f"blk.{i}.ffn_up.weight", (N_EMBD, N_FF)),
              (f"blk.{i}.ffn_down.weight", (N_FF, N_EMBD))]
    return t


def pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def build(*, magic=b"GGUF", version=3, kvs=None, tensors=None, n_tensors=None, n_kv=None,
          info_override=None, data_cut=None) -> tuple[bytes, list[int]]:
    """The file's bytes and the offsets of its section boundaries."""
    kvs = base_kvs() if kvs is None else kvs
    tensors = base_tensors() if tensors is None else tensors
    head = magic + struct.pack("<I", version)
    head += struct.pack("<Q", len(tensors) if n_tensors is None else n_tensors)
    head += struct.pack("<Q", len(kvs) if n_kv is None else n_kv)
    bounds = [4, 8, 16, 24]
    body = b""
    for v in kvs.values():
        body += v
        bounds.append(len(head) + len(body))
    infos = b""
    offset = 0
    sizes = []
    for name, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        info = s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", GGML_F32, offset)
        if info_override and name in info_override:
            info = info_override[name]
        infos += info
        bounds.append(len(head) + len(body) + len(infos))
        sizes.append(n * 4)
        offset = pad(offset + n * 4)
    meta = head + body + infos
    meta += b"\0" * (pad(len(meta)) - len(meta))
    data = b""
    for size in sizes:
        data += (b"\x00\x00\x80\x3f" * (size // 4))  # 1.0f
        data += b"\0" * (pad(len(data)) - len(data))
    bounds.append(len(meta))
    out = meta + data
    if data_cut is not None:
        out = out[: len(meta) + data_cut]
    return out, bounds


def cases() -> dict[str, bytes]:
    good, bounds = build()
    out: dict[str, bytes] = {}
    for b in sorted(set(bounds)):
        for delta in (-1, 0, 1):
            if 0 < b + delta < len(good):
                out[f"truncated-at-{b + delta:05d}"] = good[: b + delta]
    out["truncated-in-data"] = build(data_cut=100)[0]
    out["empty"] = b""
    out["magic-only"] = b"GGUF"
    out["wrong-magic"] = build(magic=b"GGUX")[0]
    for v in (0, 1, 4, 0xFFFFFFFF):  # 2 and 3 share the layout: both valid
        out[f"version-{v}"] = build(version=v)[0]
    out["n-tensors-huge"] = build(n_tensors=2**62)[0]
    out["n-tensors-too-many"] = build(n_tensors=len(base_tensors()) + 5)[0]
    out["n-tensors-too-few"] = build(n_tensors=3)[0]
    out["n-kv-huge"] = build(n_kv=2**63 - 1)[0]
    out["n-kv-too-many"] = build(n_kv=len(base_kvs()) + 3)[0]
    name = "token_embd.weight"

    def info(dims, typ=GGML_F32, offset=0, n_dims=None, tname=name):
        return (s(tname) + struct.pack("<I", len(dims) if n_dims is None else n_dims)
                + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, offset))

    out["tensor-offset-huge"] = build(info_override={name: info((N_EMBD, N_VOCAB), offset=2**60)})[0]
    out["tensor-offset-misaligned"] = build(info_override={name: info((N_EMBD, N_VOCAB), offset=3)})[0]
    out["tensor-dims-huge"] = build(info_override={name: info((2**40, 2**40))})[0]
    out["tensor-dims-overflow"] = build(info_override={name: info((2**62, 8))})[0]
    out["tensor-dims-zero"] = build(info_override={name: info((0, N_VOCAB))})[0]
    out["tensor-n-dims-9"] = build(info_override={name: info((1,) * 9)})[0]
    out["tensor-n-dims-huge"] = build(info_override={name: info((N_EMBD, N_VOCAB), n_dims=2**31)})[0]
    out["tensor-type-invalid"] = build(info_override={name: info((N_EMBD, N_VOCAB), typ=999)})[0]
    out["tensor-type-mismatch-size"] = build(info_override={name: info((N_EMBD, N_VOCAB), typ=2)})[0]
    out["tensor-wrong-shape"] = build(info_override={name: info((N_EMBD + 1, N_VOCAB))})[0]
    out["tensor-name-too-long"] = build(info_override={name: info((N_EMBD, N_VOCAB), tname="x" * 70000)})[0]
    out["tensor-duplicate-name"] = build(info_override={"output.weight": info((N_EMBD, N_VOCAB))})[0]
    kvs = base_kvs()
    kvs["qwen3.block_count"] = string("qwen3.block_count", "four")
    out["required-key-wrong-type"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["qwen3.embedding_length"] = u32("qwen3.embedding_length", 2**31)
    out["embedding-length-absurd"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["qwen3.block_count"] = u32("qwen3.block_count", 100000)
    out["block-count-absurd"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["qwen3.attention.head_count"] = u32("qwen3.attention.head_count", 0)
    out["head-count-zero"] = build(kvs=kvs)[0]
    for key in ("general.architecture", "qwen3.embedding_length", "qwen3.block_count", "tokenizer.ggml.tokens"):
        kvs = base_kvs()
        del kvs[key]
        out[f"missing-{key}"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["general.architecture"] = kv("general.architecture", T_STR, s("qwen3", length=2**62))
    out["string-length-past-eof"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["tokenizer.ggml.tokens"] = kv("tokenizer.ggml.tokens", T_ARR, struct.pack("<IQ", T_STR, 2**61))
    out["array-length-past-eof"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["tokenizer.ggml.token_type"] = kv("tokenizer.ggml.token_type", T_ARR, struct.pack("<IQ", 77, 4))
    out["array-type-invalid"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["qwen3.context_length"] = kv("qwen3.context_length", 99, b"\0" * 8)
    out["kv-type-invalid"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["dup"] = u32("qwen3.block_count", 1)
    out["duplicate-key"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["tokenizer.ggml.tokens"] = str_array("tokenizer.ggml.tokens", ["a"] * 3)
    out["vocab-duplicate-tokens"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["tokenizer.ggml.tokens"] = str_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    kvs["tokenizer.ggml.token_type"] = i32_array("tokenizer.ggml.token_type", [1] * 3)
    out["vocab-shorter-than-embeddings"] = build(kvs=kvs)[0]
    kvs = base_kvs()
    kvs["general.architecture"] = string("general.architecture", "dflash")
    out["dflash-without-keys"] = build(kvs=kvs)[0]
    # bytes that are not UTF-8 where text is expected (found by tools/fuzz_gguf.py:
    # the error and the log text quoting them must still reach Python)
    kvs = base_kvs()
    kvs["general.architecture"] = kv("general.architecture", T_STR, s(b"qw\xffen3\x80"))
    out["architecture-not-utf8"] = build(kvs=kvs)[0]
    return out


# -- the error each file must get ----------------------------------------------------------
#
# For each file and each role (loaded as the target, or as the drafter of
# good-tiny.gguf): the pydflash exception class and fragments its message must
# contain (besides the file's path). tests/test_malformed_gguf.py checks them.

Expect = tuple[str, tuple[str, ...]]
HEADER = "corrupt or truncated GGUF header"
NOT_DFLASH: Expect = ("DraftCompatibilityError", ("drafter architecture is 'qwen3', expected 'dflash'",))


def _both(exc: str, *fragments: str) -> dict[str, Expect]:
    return {"target": (exc, fragments), "drafter": (exc, fragments)}


def _gguf(*fragments: str) -> dict[str, Expect]:
    """ggml's GGUF reader refuses the file: the same for both roles."""
    return _both("ModelLoadError", HEADER, *fragments)


def _loader(*fragments: str) -> dict[str, Expect]:
    """The header reads; llama.cpp's loader refuses the target, and the drafter
    check refuses a qwen3 file before llama.cpp loads it."""
    return {"target": ("ModelLoadError", ("failed to load target model (architecture 'qwen3')", *fragments)),
            "drafter": NOT_DFLASH}


def _section(cut: int, bounds: list[int], n_kv: int, n_tensors: int, data_start: int) -> dict[str, Expect]:
    """What a file cut after ``cut`` bytes gets, from the section the cut falls in."""
    end_kv = bounds[3 + n_kv]
    end_info = bounds[3 + n_kv + n_tensors]
    if cut < 4:
        return _both("ModelLoadError", "not a GGUF file (bad magic)")
    if cut < 24:
        return _gguf("failed to read header")
    if cut < end_kv:
        return _gguf("failed to read key-value pairs")
    if cut < end_info:
        return _gguf("failed to read tensor info")
    if cut < data_start:
        return _gguf("failed to seek to beginning of data section")
    return _loader("data is not within the file bounds")


def expectations() -> dict[str, dict[str, Expect]]:
    _, bounds = build()
    data_start = bounds[-1]
    n_kv, n_tensors = len(base_kvs()), len(base_tensors())
    out: dict[str, dict[str, Expect]] = {}
    for name in cases():
        if name.startswith("truncated-at-"):
            out[name] = _section(int(name.rsplit("-", 1)[1]), bounds, n_kv, n_tensors, data_start)
    block_count = _both("ModelLoadError", "qwen3.block_count must be an integer in [1, 512] (llama.cpp's layer limit)")
    out.update({
        "truncated-in-data": _loader("tensor 'token_embd.weight' data is not within the file bounds"),
        "empty": _both("ModelLoadError", "not a GGUF file (bad magic)"),
        "magic-only": _gguf("failed to read header"),
        "wrong-magic": _both("ModelLoadError", "not a GGUF file (bad magic)"),
        "version-0": _gguf("bad GGUF version: 0"),
        "version-1": _gguf("GGUFv1 is no longer supported"),
        "version-4": _gguf("version 4 but this software only supports up to version 3"),
        "version-4294967295": _gguf("version 4294967295 but this software only supports up to version 3"),
        "n-tensors-huge": _gguf("number of tensors is 4611686018427387904 but must be in"),
        "n-tensors-too-many": _gguf("failed to read tensor info"),
        "n-tensors-too-few": _loader("tensor 'blk.0.attn_norm.weight' not found"),
        "n-kv-huge": _gguf("number of key value pairs is 9223372036854775807 but must be in"),
        "n-kv-too-many": _gguf("failed to read key-value pairs"),
        "tensor-offset-huge": _gguf("tensor 'token_embd.weight' has offset 1152921504606846976, expected 0"),
        "tensor-offset-misaligned": _gguf("tensor 'token_embd.weight' has offset 3, expected 0"),
        "tensor-dims-huge": _gguf("incorrect shape for a tensor 'token_embd.weight' may cause overflow"),
        "tensor-dims-overflow": _gguf("incorrect shape for a tensor 'token_embd.weight' may cause overflow"),
        # a zero dimension makes the tensor empty: the next tensor's offset no longer fits
        "tensor-dims-zero": _gguf("tensor 'output_norm.weight' has offset 512, expected 0"),
        "tensor-n-dims-9": _gguf("tensor 'token_embd.weight' has invalid number of dimensions: 9 > 4"),
        "tensor-n-dims-huge": _gguf("tensor 'token_embd.weight' has invalid number of dimensions: 2147483648 > 4"),
        "tensor-type-invalid": _gguf("tensor 'token_embd.weight' has invalid ggml type 999"),
        "tensor-type-mismatch-size": _gguf("tensor 'token_embd.weight' of type 2 (q4_0) has 16 elements per row, "
                                           "not a multiple of block size (32)"),
        "tensor-wrong-shape": _gguf("tensor 'output_norm.weight' has offset 512, expected 544"),
        "tensor-name-too-long": _gguf("tensor name 0 is too long: 70000 >= 64"),
        "tensor-duplicate-name": _gguf("duplicate tensor name 'token_embd.weight'"),
        "required-key-wrong-type": {r: (e, (*f, "got four")) for r, (e, f) in block_count.items()},
        "embedding-length-absurd": _loader("tensor 'token_embd.weight' has wrong shape"),
        "block-count-absurd": {r: (e, (*f, "got 100000")) for r, (e, f) in block_count.items()},
        "head-count-zero": _loader("tensor 'blk.0.attn_q.weight' has wrong shape"),
        "missing-general.architecture": _both("ModelLoadError", "GGUF file has no general.architecture key"),
        "missing-qwen3.embedding_length": _loader("key not found in model: qwen3.embedding_length"),
        "missing-qwen3.block_count": _loader("key not found in model: qwen3.block_count"),
        "missing-tokenizer.ggml.tokens": _loader("cannot find tokenizer vocab in model file"),
        "string-length-past-eof": _gguf("string length 4611686018427387904 exceeds maximum"),
        "array-length-past-eof": _gguf("failed to read key-value pairs"),
        "array-type-invalid": _gguf("key 'tokenizer.ggml.token_type' has invalid GGUF type 77"),
        "kv-type-invalid": _gguf("key 'qwen3.context_length' has invalid GGUF type 99"),
        "duplicate-key": _gguf("duplicate key 'qwen3.block_count'"),
        "vocab-duplicate-tokens": _both("ModelLoadError", "tokenizer.ggml.tokens has a duplicate token at index 1"),
        "vocab-shorter-than-embeddings": _loader("tensor 'token_embd.weight' has wrong shape; expected     16,      3"),
        "dflash-without-keys": {
            "target": ("ModelLoadError", ("failed to load target model (architecture 'dflash')",
                                          "key not found in model: dflash.context_length")),
            "drafter": ("ModelLoadError", ("failed to load drafter model (architecture 'dflash')",
                                           "key not found in model: dflash.context_length"))},
        "architecture-not-utf8": {
            "target": ("ModelLoadError", ("unknown model architecture: 'qw\ufffden3\ufffd'",)),
            "drafter": ("DraftCompatibilityError", ("drafter architecture is 'qw\ufffden3\ufffd', expected 'dflash'",))},
    })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "data" / "bad_gguf")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.glob("*.gguf"):
        old.unlink()
    for name, data in cases().items():
        (a.out / f"{name}.gguf").write_bytes(data)
    good, _ = build()
    (a.out.parent / "good-tiny.gguf").write_bytes(good)
    print(f"wrote {len(cases())} files to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
