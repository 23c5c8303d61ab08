#!/usr/bin/env python3
"""Compare two runs of llama.cpp's server tests (JUnit XML, pytest's --junitxml):
llama-server's and pydflash's on the same local model (tools/llama_server_shim.py).
The goal of issue #48 is pydflash passing >= 95% of the tests llama-server passes,
among those whose feature pydflash serves: the files in OUT_OF_SCOPE test features
pydflash refuses by design (embeddings, rerank, multimodal input, LoRA, the model
router and what runs on it: MCP servers, built-in tools, the MCP proxy).

    python tools/server_suite_compare.py ls.xml pydflash.xml [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter

OUT_OF_SCOPE = {
    "test_embedding",
    "test_rerank",
    "test_vision_api",
    "test_lora",
    "test_router",
    "test_mcp_servers",
    "test_tools_builtin",
    "test_proxy",
}


def outcomes(path: str) -> dict[str, tuple[str, str]]:
    """test id -> (pass | fail | skip, the failure's message)."""
    out: dict[str, tuple[str, str]] = {}
    for tc in ET.parse(path).iter("testcase"):
        state, message = "pass", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                state, message = (
                    "fail",
                    (child.get("message") or "").splitlines()[0][:200] if child.get("message") else "",
                )
            elif child.tag == "skipped":
                state = "skip"
        out[f"{tc.get('classname', '').split('.')[-1]}::{tc.get('name')}"] = (state, message)
    return out


def compare(reference: dict[str, tuple[str, str]], candidate: dict[str, tuple[str, str]]) -> dict[str, object]:
    passed = sorted(k for k, (s, _) in reference.items() if s == "pass")
    in_scope = [k for k in passed if k.split("::")[0] not in OUT_OF_SCOPE]
    kept = [k for k in in_scope if candidate.get(k, ("missing", ""))[0] == "pass"]
    lost = {k: candidate.get(k, ("missing", "not run"))[1] for k in in_scope if k not in kept}
    return {
        "reference_passed": len(passed),
        "reference_passed_in_scope": len(in_scope),
        "candidate_passed": sum(s == "pass" for s, _ in candidate.values()),
        "candidate_passed_of_in_scope": len(kept),
        "share": round(len(kept) / len(in_scope), 4) if in_scope else None,
        "out_of_scope_files": sorted(OUT_OF_SCOPE),
        "failing_by_file": dict(Counter(k.split("::")[0] for k in lost)),
        "failing": lost,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference", help="llama-server's JUnit XML")
    ap.add_argument("candidate", help="pydflash's JUnit XML")
    ap.add_argument("--json", help="write the comparison here")
    a = ap.parse_args(argv)
    res = compare(outcomes(a.reference), outcomes(a.candidate))
    print(
        f"llama-server passed {res['reference_passed']} ({res['reference_passed_in_scope']} in scope); "
        f"pydflash passed {res['candidate_passed_of_in_scope']} of those in scope ({res['share']:.1%})"
    )
    for k, msg in res["failing"].items():  # type: ignore[union-attr]
        print(f"  {k}: {msg}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), **res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
