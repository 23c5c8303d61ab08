"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``),
for the chat page's browser test (tests/test_webui.py) and its screenshot in the docs
(tools/docs_figures.py). It uses the system's Chromium (Debian: ``apt-get install chromium``):
nothing is downloaded and no websocket library is needed. Waits are on page conditions
(a MutationObserver in the page), never fixed sleeps."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
KEYS = {"Enter": 13, "Tab": 9, "Escape": 27}


def find_chromium() -> str | None:
    """$PYDFLASH_CHROMIUM, else the first Chromium on PATH; None when there is none."""
    explicit = os.environ.get("PYDFLASH_CHROMIUM")
    if explicit:
        return explicit
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def _high(fds: tuple[int, int]) -> tuple[int, int]:
    """The pipe's ends moved to fds over 9: putting them at 3 and 4 must not overwrite them."""
    out = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return out[0], out[1]


class BrowserError(RuntimeError):
    """A DevTools command failed, the page threw, or a wait ran out."""


class Browser:
    """One headless Chromium process; ``page()`` opens a tab. Commands go to fd 3 of the
    browser, answers and events come from its fd 4, as NUL-terminated JSON."""

    def __init__(self, executable: str, timeout: float = 120.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="pydflash-chromium-")
        cmd_r, self._cmd_w = _high(os.pipe())
        self._out_r, out_w = _high(os.pipe())
        args = [
            shutil.which(executable) or executable,
            "--headless=new",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--hide-scrollbars",
            "--mute-audio",
            *(["--no-sandbox"] if os.geteuid() == 0 else []),  # Chromium's sandbox refuses root
            "about:blank",
        ]
        # a small trampoline puts the pipes at the fds Chromium reads and writes (3, 4), then
        # becomes Chromium (a shell cannot: dash takes single-digit fds only)
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        self._log = open(Path(self.profile) / "chromium.log", "wb")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(cmd_r), str(out_w), *args],
            pass_fds=(cmd_r, out_w),
            stdout=self._log,
            stderr=self._log,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._next = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._out_r, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result."""
        with self._cond:
            self._next += 1
            n = self._next
        msg: dict[str, Any] = {"id": n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        with self._cond:
            if not self._cond.wait_for(lambda: n in self._answers or self.proc.poll() is not None, self.timeout):
                raise BrowserError(f"{method}: no answer in {self.timeout} s")
            if n not in self._answers:
                raise BrowserError(f"{method}: Chromium exited ({self.proc.returncode})")
            answer = self._answers.pop(n)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message')}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def wait_event(self, method: str, session: str | None, after: int) -> dict[str, Any]:
        """The first event ``method`` of ``session`` among the events from index ``after`` on."""

        def found() -> dict[str, Any] | None:
            return next(
                (e for e in self.events[after:] if e["method"] == method and e.get("sessionId") == session), None
            )

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None or self.proc.poll() is not None, self.timeout):
                raise BrowserError(f"no {method} in {self.timeout} s")
            event = found()
        if event is None:
            raise BrowserError(f"Chromium exited ({self.proc.returncode}) before {method}")
        return event

    def page(self, width: int = 1280, height: int = 860) -> Page:
        """A new tab of ``width`` x ``height`` CSS pixels."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        page.viewport(width, height)
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(BrowserError):
                    self.call("Browser.close")
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            os.close(self._cmd_w)
            self._reader.join(timeout=10)
            os.close(self._out_r)
            self._log.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: navigate, evaluate, wait for a condition, type and press keys, screenshots."""

    def __init__(self, browser: Browser, session: str):
        self.browser = browser
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def viewport(self, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )

    def goto(self, url: str) -> None:
        """Load ``url`` and return after its load event."""
        mark = len(self.browser.events)
        self.call("Page.navigate", {"url": url})
        self.browser.wait_event("Page.loadEventFired", self.session, mark)

    def reload(self) -> None:
        mark = len(self.browser.events)
        self.call("Page.reload")
        self.browser.wait_event("Page.loadEventFired", self.session, mark)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited)."""
        out = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in out:
            details = out["exceptionDetails"]
            raise BrowserError((details.get("exception") or {}).get("description") or details.get("text"))
        return out["result"].get("value")

    def wait(self, condition: str, timeout_s: float = 120.0) -> Any:
        """The first truthy value of the expression ``condition``, checked now and after
        each change of the page's DOM (a BrowserError after ``timeout_s``)."""
        what = json.dumps(condition)
        js = f"""new Promise((resolve, reject) => {{
          let obs = null, timer = null;
          const check = () => {{
            const v = ({condition});
            if (!v) return false;
            if (obs) obs.disconnect();
            clearTimeout(timer);
            resolve(v);
            return true;
          }};
          if (check()) return;
          obs = new MutationObserver(() => {{ try {{ check(); }} catch (e) {{ obs.disconnect(); reject(e); }} }});
          obs.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
          const late = () => {{ obs.disconnect(); reject(new Error("timed out waiting for: " + {what})); }};
          timer = setTimeout(late, {int(timeout_s * 1000)});
        }})"""
        return self.eval(js)

    def key(self, name: str, shift: bool = False) -> None:
        """Press and release a key (Enter, Tab, Escape) as a keyboard would."""
        code = KEYS[name]
        base = {"key": name, "code": name, "windowsVirtualKeyCode": code, "modifiers": 8 if shift else 0}
        text = {"text": "\r"} if name == "Enter" else {}
        self.call("Input.dispatchKeyEvent", {"type": "keyDown", **base, **text})
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def type(self, text: str) -> None:
        """Type ``text`` into the focused element."""
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path: str | os.PathLike[str]) -> Path:
        """A PNG of the viewport."""
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        out = Path(path)
        out.write_bytes(base64.b64decode(data))
        return out

    def errors(self) -> list[str]:
        """The page's uncaught exceptions and console errors so far."""
        out = []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            if e["method"] == "Runtime.exceptionThrown":
                details = e["params"]["exceptionDetails"]
                out.append((details.get("exception") or {}).get("description") or details.get("text", ""))
            elif e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error":
                out.append(e["params"]["entry"]["text"])
        return out


# -- the chat page (src/pydflash/server/webui/): what its test and its screenshot do ------------

FIELDS = {"mode": "set-mode", "system": "set-system", "temperature": "set-temperature", "top_p": "set-top-p",
          "seed": "set-seed", "max_tokens": "set-max-tokens", "draft": "set-draft", "custom": "set-custom"}  # fmt: skip


def open_chat(browser: Browser, url: str, width: int = 1280, height: int = 860) -> Page:
    """A tab on the chat page at ``url``, once its model card is filled in from /props."""
    page = browser.page(width, height)
    page.goto(url.rstrip("/") + "/")
    page.wait("document.querySelector('[data-field=target]').textContent.endsWith('.gguf')")
    return page


def set_fields(page: Page, **values: str) -> None:
    """Settings, as typed into their fields (``draft="7"``, ``mode="chat"``, ...)."""
    for name, value in values.items():
        page.eval(
            f"(() => {{ const f = document.getElementById({json.dumps(FIELDS[name])}); f.value = {json.dumps(value)};"
            " f.dispatchEvent(new Event('input', {bubbles: true})); return f.value; })()"
        )


def send(page: Page, text: str) -> int:
    """Type ``text`` into the message box and press Enter; wait for the streamed reply to end.
    Returns the number of replies on the page."""
    n = page.eval("document.querySelectorAll('.msg.assistant').length")
    page.eval("document.getElementById('composer-input').focus()")
    page.type(text)
    page.key("Enter")
    page.wait(f"document.querySelectorAll('.msg.assistant[data-done=true]').length === {n + 1}")
    return int(n) + 1


def chat_screenshot(url: str, path: str | os.PathLike[str], executable: str) -> Path:
    """The docs' picture of the page: one reply of the server at ``url`` (draft length 7,
    greedy), as a 1280 x 860 PNG at ``path``."""
    with Browser(executable) as browser:
        page = open_chat(browser, url)
        set_fields(page, temperature="0", max_tokens="64", draft="7", seed="-1")
        send(page, 'def is_prime(n):\n    """Return True if n is a prime number."""\n')
        page.wait("document.querySelectorAll('.msg.assistant .content .tok').length > 0")
        return page.screenshot(path)
