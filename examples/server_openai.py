"""Start ``pydflash serve`` and talk to it with the official ``openai`` client:
a chat completion, a streamed completion, then the server's speculative metrics.

    pip install openai "pydflash[server]"
    python examples/server_openai.py                          # the embedded pair
    python examples/server_openai.py --url http://127.0.0.1:8080   # a server you started yourself:
                                                              #   pydflash serve -m T.gguf -md D.gguf --metrics
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import urllib.request
from typing import Optional

import openai


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "pydflash", "serve", "--port", "0", "--metrics"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"on (http://\S+:\d+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("the server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="an already running server (default: start one on a free port)")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    proc: Optional[subprocess.Popen] = None
    url = a.url
    if url is None:
        proc, url = start_server()
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="not-needed")
        model = client.models.list().data[0].id
        print(f"server {url}, model {model}")

        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "def merge_sort(items):"}],
            max_tokens=a.max_tokens, temperature=0)
        timings = chat.to_dict()["timings"]  # llama-server-style extra field
        print("chat:", chat.choices[0].message.content)
        print(f"  drafted {timings['draft_n']}, accepted {timings['draft_n_accepted']}")

        print("stream: ", end="")
        for chunk in client.completions.create(model=model, prompt="import os\n", max_tokens=a.max_tokens,
                                               temperature=0, stream=True):
            print(chunk.choices[0].text, end="", flush=True)
        print()

        with urllib.request.urlopen(url + "/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith(("pydflash_draft", "pydflash_tokens_per_target_pass",
                                    "pydflash_predicted_tokens_seconds")):
                    print("metrics:", line)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
