"""llama.cpp's log goes to the Python logger ``pydflash``: quiet by default
(nothing on the process's stderr either), shown with verbose=True or -v."""

from __future__ import annotations

import logging
import subprocess
import sys

from pydflash import Llama, _logging


def test_quiet_by_default(target_path, model_dir, caplog, capfd):
    with caplog.at_level(logging.DEBUG, logger="pydflash"):
        with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256) as llm:
            llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4)
    assert [r for r in caplog.records if r.levelno < logging.WARNING] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # llama.cpp printed nothing itself


def test_verbose_routes_llama_cpp_log_to_logging(target_path, caplog, capfd):
    logger = logging.getLogger("pydflash")
    level = logger.level
    try:
        with caplog.at_level(logging.DEBUG, logger="pydflash"):
            with Llama(target_path, n_ctx=256, verbose=True) as llm:
                llm.generate("x", max_tokens=2)
        msgs = [r.getMessage() for r in caplog.records if r.name == "pydflash"]
        assert any("llama_model_loader" in m or "load_tensors" in m for m in msgs), msgs[:5]
        assert capfd.readouterr().err == ""  # through logging only, not printed by llama.cpp
    finally:
        _logging.set_verbose(False)
        logger.setLevel(level)


def test_cli_verbose_flag(target_path):
    def run(*extra: str) -> str:
        return subprocess.run([sys.executable, "-m", "pydflash", "generate", "-m", str(target_path), "-p", "x",
                               "-n", "2", "--n-ctx", "256", *extra], capture_output=True, text=True,
                              timeout=120).stderr

    assert "llama_model_loader" not in run()
    assert "pydflash: llama_model_loader" in run("-v")
