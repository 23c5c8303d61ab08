"""Time to the first token on the chat page against curl, for the same request (run from the
repository root; needs curl and a Chromium):

    python benchmarks/webui_ttft.py [--rounds 10] [--serve-args "-t 1"]

It starts `pydflash serve` (the embedded pair) on 127.0.0.1, then alternates: the page sends
a message in a new conversation (its time from the request to the first token drawn in the
page, which the page records as ``ttftMs``), and curl sends the same body (from its trace:
the time from sending the request to receiving the first chunk with text). Both bodies
skip the prompt cache, so every request evaluates its prompt. Prints the medians and each
round's pair; the first round warms up and is left out."""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import webui_browser as wb  # noqa: E402  (tools/webui_browser.py: the chat page's browser driver)

from support.http import serve  # noqa: E402  (the tests' helper: `pydflash serve` on a free port)

MESSAGE = "Write a function that checks whether a number is prime."
FIELDS = {"mode": "chat", "temperature": "0", "max_tokens": "16", "draft": "auto", "seed": "-1"}


def body() -> dict[str, object]:
    """What the page sends with FIELDS and a new conversation (app.js requestBody)."""
    return {"stream": True, "timings_per_token": True, "max_tokens": 16, "temperature": 0.0, "top_p": 0.95,
            "messages": [{"role": "user", "content": MESSAGE}], "cache_prompt": False}  # fmt: skip


def curl_ttft(url: str) -> float:
    """ms from curl sending the request to its receiving the first chunk with text (--trace-time)."""
    trace = subprocess.run(
        ["curl", "-s", "-N", "-o", "/dev/null", "--trace-ascii", "-", "--trace-time", "-H",
         "Content-Type: application/json", "-d", json.dumps(body()), url + "/v1/chat/completions"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    # each traced event: "HH:MM:SS.ffffff <what>", then its bytes as "OFFS: text" lines
    events = re.split(r"^(\d\d:\d\d:\d\d\.\d{6}) ", trace, flags=re.M)[1:]
    sent = first = None
    for stamp, text in zip(events[::2], events[1::2], strict=True):
        at = datetime.datetime.strptime(stamp, "%H:%M:%S.%f")
        data = "".join(line[6:] for line in text.splitlines()[1:])
        if text.startswith("=> Send header") and sent is None:
            sent = at
        if text.startswith("<= Recv data") and re.search(r'"content": "[^"]', data):
            first = at
            break
    assert sent is not None and first is not None, trace[-2000:]
    return (first - sent).total_seconds() * 1e3


def page_ttft(page: wb.Page) -> float:
    page.eval("document.getElementById('new-chat').click()")
    page.wait("document.querySelectorAll('.msg').length === 0")
    wb.send(page, MESSAGE)
    convs = page.eval("JSON.parse(localStorage.getItem('pydflash.webui.conversations')).convs")
    return float(convs[0]["messages"][-1]["ttftMs"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--serve-args", default="-t 1", help="extra flags of pydflash serve")
    a = ap.parse_args(argv)
    chromium = wb.find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium on PATH (apt-get install chromium)")
    with serve(*shlex.split(a.serve_args)) as url, wb.Browser(chromium) as browser:
        page = wb.open_chat(browser, url)
        wb.set_fields(page, **FIELDS, custom=json.dumps({"cache_prompt": False}))
        top_p = page.eval("document.getElementById('set-top-p').value")
        assert float(top_p) == body()["top_p"], f"the server's default top_p is {top_p}: update body()"
        rounds = [(page_ttft(page), curl_ttft(url)) for _ in range(a.rounds + 1)][1:]
    for p, c in rounds:
        print(f"page {p:7.1f} ms   curl {c:7.1f} ms   page - curl {p - c:+7.1f} ms")
    pm, cm = statistics.median(p for p, _ in rounds), statistics.median(c for _, c in rounds)
    diff = statistics.median(p - c for p, c in rounds)
    print(f"median: page {pm:.1f} ms, curl {cm:.1f} ms; median of (page - curl) {diff:+.1f} ms over {len(rounds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
