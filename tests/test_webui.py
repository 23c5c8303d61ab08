"""The chat page in a real browser: headless Chromium (the system's, Debian's package in
.ci/run; driven over the DevTools protocol by tools/webui_browser.py, which downloads
nothing) against a real `pydflash serve` on 127.0.0.1 with the embedded pair. The page
streams a reply and colours each token by how it was made; the counts it shows are
checked against the server's own /metrics. Waits are on page conditions, never sleeps.

Skipped, with the reason, only where no Chromium binary exists; .ci/run installs Debian's
chromium and sets PYDFLASH_REQUIRE_CHROMIUM, under which a missing one is an error."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import time
from pathlib import Path

import pytest

from support.http import get, metrics, serve

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("webui_browser", ROOT / "tools" / "webui_browser.py")
assert _spec is not None and _spec.loader is not None
wb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wb)

CHROMIUM = wb.find_chromium()
if CHROMIUM is None and os.environ.get("PYDFLASH_REQUIRE_CHROMIUM"):  # .ci/run: the test must run
    raise RuntimeError("PYDFLASH_REQUIRE_CHROMIUM is set but no Chromium binary is on PATH")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium binary on PATH (apt-get install chromium, or set PYDFLASH_CHROMIUM)"
)
SERVE = ("-t", "1", "-c", "2048")  # one thread: these tests are not about threads

# a reply the grammar forces: markup the page must show as text, never run
MARKUP = ("Look: <script>window.pwned = 1</script> and <img src=x onerror=window.pwned=2> in **bold** "
          "and `<b>code</b>`\n\n```html\n<script>window.pwned = 3</script>\n```\n")  # fmt: skip
GRAMMAR = "root ::= " + json.dumps(MARKUP)


@pytest.fixture(scope="module")
def server():
    with serve(*SERVE) as url:
        yield url


@pytest.fixture
def browser():
    with wb.Browser(CHROMIUM) as b:  # a new profile each time: its own local storage
        yield b


def _reply(page, i: int = -1) -> dict:
    """What the page shows of reply ``i``: its token view (opened), rendered text, figures."""
    return page.eval(f"""(() => {{
      const art = [...document.querySelectorAll('.msg.assistant')].at({i});
      const tokens = art.querySelector('[data-action=tokens]');
      if (tokens.getAttribute('aria-pressed') !== 'true') tokens.click();
      const view = art.querySelector('.token-view');
      const stat = (name) => Number(art.querySelector(`[data-stat=${{name}}] dd`).dataset.value);
      return {{
        spans: view.querySelectorAll('.tok').length,
        drafted: view.querySelectorAll('.tok.d').length,
        own: view.querySelectorAll('.tok.t').length,
        token_text: [...view.querySelectorAll('.tok')].map((s) => s.textContent).join(''),
        painted: art.querySelectorAll('.content .tok.d').length + ' ' + art.querySelectorAll('.content .tok.t').length,
        text: art.querySelector('.content').textContent,
        tau: stat('tau'),
        tau_shown: art.querySelector('[data-stat=tau] dd').textContent,
        bars: art.querySelectorAll('.chart rect.t').length,
      }};
    }})()""")


def _counter_reaches(server: str, name: str, value: float, within_s: float = 30.0) -> bool:
    """Whether /metrics' counter ``name`` reaches ``value``, read until it does or ``within_s`` passes."""
    deadline = time.monotonic() + within_s
    while metrics(server)[name] < value:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return metrics(server)[name] == value


def _stored() -> str:
    return "JSON.parse(localStorage.getItem('pydflash.webui.conversations'))"


def test_a_streamed_reply_colours_each_token_and_its_figures_are_the_servers(server, browser):
    page = wb.open_chat(browser, server)
    props = json.loads(get(server + "/props")[1])
    card = page.eval("Object.fromEntries([...document.querySelectorAll('#model-card dd')]"
                     ".map((d) => [d.dataset.field, d.textContent]))")  # fmt: skip
    assert card["target"] == Path(props["model_path"]).name
    assert card["drafter"].startswith(Path(props["draft_model_path"]).name)
    assert card == {**card, "n_ctx": "2048 tokens", "n_parallel": "1", "rollback": "kv-trim"}
    wb.set_fields(page, mode="chat", temperature="0", max_tokens="40", draft="5")
    # the message box is reached with the keyboard alone
    for _ in range(40):
        if page.eval("document.activeElement.id") == "composer-input":
            break
        page.key("Tab")
    assert page.eval("document.activeElement.id") == "composer-input"
    before = metrics(server)
    page.type("def fib(n):")
    page.key("Enter")
    page.wait("document.querySelector('.msg.assistant[data-done=true]')")
    after = metrics(server)
    got = _reply(page)

    def delta(name: str) -> float:
        return after[name] - before[name]

    n, passes = delta("llamacpp:tokens_predicted_total"), delta("pydflash_target_passes_total")
    assert got["spans"] == n == 40  # one coloured span per token of the reply
    assert got["drafted"] == delta("pydflash_draft_tokens_accepted_total") > 0  # drafted and accepted
    assert got["drafted"] + got["own"] == n and got["own"] > 0
    assert got["tau"] == pytest.approx(n / passes, rel=1e-12) and got["tau_shown"] == f"{n / passes:.2f}"
    assert got["bars"] == passes  # the chart: one bar per target pass
    reply = page.eval(_stored())["convs"][0]["messages"][-1]
    assert got["token_text"] == reply["content"] and reply["content"]
    assert all(int(k) > 0 for k in got["painted"].split())  # the rendered text is coloured by kind too
    assert page.errors() == []


def test_conversations_switch_and_come_back_after_a_reload(server, browser):
    page = wb.open_chat(browser, server)
    wb.set_fields(page, mode="chat", temperature="0", max_tokens="12", draft="auto")
    wb.send(page, "first question")
    first = _reply(page)["text"]
    page.eval("document.getElementById('new-chat').click()")
    page.wait("document.querySelectorAll('.msg').length === 0")
    wb.send(page, "second question")
    titles = "[...document.querySelectorAll('#chat-list .conv')].map((b) => b.textContent)"
    assert page.eval(titles) == ["second question", "first question"]
    page.eval("document.querySelector('#chat-list .conv:not([aria-current])').click()")
    page.wait("document.querySelector('.msg.user') && "
              "document.querySelector('.msg.user').textContent.includes('first question')")  # fmt: skip
    assert _reply(page)["text"] == first
    page.reload()
    page.wait("document.querySelector('[data-field=target]').textContent.endsWith('.gguf')")
    assert page.eval(titles) == ["second question", "first question"]
    assert page.eval("document.querySelector('#chat-list [aria-current=true]').textContent") == "first question"
    again = _reply(page)
    assert again["text"] == first and again["spans"] == 12  # its tokens and their kinds were kept
    page.eval("document.querySelector('#chat-list .conv:not([aria-current])').click()")
    page.wait("document.querySelector('.msg.user').textContent.includes('second question')")
    assert page.errors() == []


def test_markup_in_a_reply_stays_text(server, browser):
    page = wb.open_chat(browser, server)
    # the grammar forces the real model's reply: tags, a handler and a code block of markup
    wb.set_fields(page, mode="chat", temperature="0", max_tokens="200", custom=json.dumps({"grammar": GRAMMAR}))
    wb.send(page, MARKUP)  # the user's message is the same markup: drawn uncoloured
    for reloaded in (False, True):
        if reloaded:  # drawn again from local storage
            page.reload()
            page.wait("document.querySelector('.msg.assistant[data-done=true]')")
        assert page.eval("window.pwned === undefined")
        for art in ("document.querySelector('.msg.user')", "document.querySelector('.msg.assistant')"):
            assert page.eval(f"{art}.querySelectorAll('script, img, b').length") == 0
            text = page.eval(f"{art}.querySelector('.content').textContent")
            assert "<script>window.pwned = 1</script>" in text and "<img src=x onerror=window.pwned=2>" in text
            assert page.eval(f"{art}.querySelector('.content strong').textContent") == "bold"  # Markdown, rendered
            assert page.eval(f"{art}.querySelector('.content p code').textContent") == "<b>code</b>"
            code = page.eval(f"{art}.querySelector('.content pre code').textContent")
            assert code == "<script>window.pwned = 3</script>"
        assert _reply(page)["token_text"] == MARKUP  # the tokens, one by one, as text
    assert page.errors() == []


def test_stop_regenerate_and_copy(server, browser):
    page = wb.open_chat(browser, server)
    wb.set_fields(page, mode="text", temperature="0", max_tokens="2000", draft="auto")
    before = metrics(server)["pydflash_requests_cancelled_total"]
    page.eval("document.getElementById('composer-input').focus()")
    page.type("def main():\n")
    page.key("Enter")
    page.wait("document.querySelector('.msg.assistant .content .tok')")  # tokens are arriving
    assert page.eval("document.getElementById('stop').disabled") is False
    page.key("Escape")  # stops the reply, from anywhere on the page
    page.wait("document.querySelector('.msg.assistant[data-done=true]')")
    assert page.eval("document.getElementById('status').textContent") == "Stopped."
    stopped = page.eval(_stored())["convs"][0]["messages"][-1]
    assert stopped["finish"] == "stopped" and 0 < len(stopped["tokens"]) < 2000
    # the server sees the client leave and cancels the generation (counted once it notices)
    assert _counter_reaches(server, "pydflash_requests_cancelled_total", before + 1)
    # regenerate: a new reply in its place (greedy: the same text, now to the end)
    wb.set_fields(page, max_tokens="10")
    page.eval("document.querySelector('.msg.assistant [data-action=regenerate]').click()")
    page.wait("document.querySelectorAll('.msg.assistant').length === 1 && "
              "document.querySelector('.msg.assistant[data-done=true]')")  # fmt: skip
    again = page.eval(_stored())["convs"][0]["messages"]
    assert [m["role"] for m in again] == ["user", "assistant"] and len(again[-1]["tokens"]) == 10
    assert stopped["content"].startswith(again[-1]["content"]) or again[-1]["content"].startswith(stopped["content"])
    # copy: the reply's text on the clipboard
    origin = server.rstrip("/")
    browser.call("Browser.grantPermissions", {"origin": origin, "permissions": ["clipboardReadWrite"]})
    page.eval("document.querySelector('.msg.assistant [data-action=copy]').click()")
    page.wait("document.getElementById('status').textContent === 'Copied.'")
    assert page.eval("navigator.clipboard.readText()") == again[-1]["content"]


def test_speed_against_the_target_alone_once_measured(server, browser):
    page = wb.open_chat(browser, server)
    wb.set_fields(page, mode="text", temperature="0", max_tokens="24", draft="0")
    wb.send(page, "import os\n")  # draft length 0: the target alone, which measures its speed
    alone = page.eval(_stored())["convs"][0]["messages"][-1]
    assert set(alone["kinds"]) == {"t"} and all(p["draft_max"] == 0 for p in alone["passes"])
    baseline = page.eval("JSON.parse(localStorage.getItem('pydflash.webui.baseline'))")
    assert baseline["tps"] == alone["timings"]["predicted_per_second"] > 0
    wb.set_fields(page, draft="5")
    wb.send(page, "import sys\n")
    tps = page.eval(_stored())["convs"][0]["messages"][-1]["timings"]["predicted_per_second"]
    shown = page.eval("[...document.querySelectorAll('[data-stat=speed] dd')].at(-1).textContent")
    assert f"{tps / baseline['tps']:.2f}× target alone ({baseline['tps']:.1f})" in shown


def test_phone_width(server, browser):
    page = wb.open_chat(browser, server, width=390, height=844)
    # nothing wider than the screen; the message box and its buttons in view
    assert page.eval("document.documentElement.scrollWidth <= window.innerWidth")
    box = page.eval("(() => { const r = document.getElementById('send').getBoundingClientRect();"
                    " return [r.left, r.right, r.bottom]; })()")  # fmt: skip
    assert 0 <= box[0] and box[1] <= 390 and box[2] <= 844
    assert page.eval("getComputedStyle(document.getElementById('sidebar')).display") == "none"
    page.eval("document.getElementById('toggle-sidebar').click()")
    assert page.eval("getComputedStyle(document.getElementById('sidebar')).display") == "block"
    assert page.eval("document.getElementById('toggle-sidebar').getAttribute('aria-expanded')") == "true"
    page.key("Escape")  # closes it, back to the button that opened it
    assert page.eval("getComputedStyle(document.getElementById('sidebar')).display") == "none"
    assert page.eval("document.activeElement.id") == "toggle-sidebar"


def test_every_control_has_a_label(server, browser):
    page = wb.open_chat(browser, server)
    page.eval("document.getElementById('toggle-settings').click()")
    unlabelled = page.eval("""[...document.querySelectorAll('input, select, textarea, button')]
      .filter((e) => !e.closest('[hidden]'))
      .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
      .map((e) => e.id || e.outerHTML)""")
    assert unlabelled == []


def test_the_page_asks_for_the_api_key_and_sends_it(browser):
    with serve(*SERVE, "--api-key", "sesame") as url:
        page = browser.page()
        page.goto(url + "/")  # the page needs no key
        page.wait("!document.getElementById('key-form').hidden")
        assert page.eval("document.activeElement.id") == "key-input"
        page.type("wrong")
        page.key("Enter")
        page.wait("document.getElementById('key-message').textContent.includes('refused')")
        page.eval("document.getElementById('key-input').value = ''")
        page.type("sesame")
        page.key("Enter")
        page.wait("document.querySelector('[data-field=target]').textContent.endsWith('.gguf')")
        assert page.eval("document.getElementById('key-form').hidden")
        wb.set_fields(page, mode="chat", max_tokens="8")
        wb.send(page, "hello")
        assert _reply(page)["spans"] == 8


def test_the_docs_screenshot(server, tmp_path):
    shot = wb.chat_screenshot(server, tmp_path / "webui.png", CHROMIUM)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1280, 860)  # IHDR: the viewport
