"""llama.cpp's log goes to the Python logger ``pydflash.llama_cpp``: quiet by default
(nothing on the process's stderr either); verbose=True or -v also print it to
stderr, as llama-cpp-python does."""

from __future__ import annotations

import logging
import subprocess
import sys

from pydflash import Llama, _logging


def test_quiet_by_default(target_path, model_dir, caplog, capfd):
    with caplog.at_level(logging.DEBUG, logger="pydflash"):
        with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256) as llm:
            llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4)
    assert [r for r in caplog.records if r.name == "pydflash.llama_cpp" and r.levelno < logging.WARNING] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # llama.cpp printed nothing itself


def test_verbose_prints_llama_cpp_log_to_stderr_and_to_logging(target_path, caplog, capfd):
    try:
        with caplog.at_level(logging.DEBUG, logger="pydflash"):
            with Llama(target_path, n_ctx=256, verbose=True) as llm:
                llm.generate("x", max_tokens=2)
        msgs = [r.getMessage() for r in caplog.records if r.name == "pydflash.llama_cpp"]
        assert any("llama_model_loader" in m or "load_tensors" in m for m in msgs), msgs[:5]
        assert "llama_model_loader" in capfd.readouterr().err
    finally:
        _logging.set_verbose(False)


def test_quiet_prints_no_warning_either(target_path, capfd):
    # n_ctx above the model's training context: llama.cpp warns; only logging hears it
    with Llama(target_path, n_ctx=8192, verbose=False):
        pass
    assert capfd.readouterr().err == ""


def test_cli_verbose_flag(target_path):
    def run(*extra: str) -> str:
        return subprocess.run([sys.executable, "-m", "pydflash", "generate", "-m", str(target_path), "-p", "x",
                               "-n", "2", "--n-ctx", "256", *extra], capture_output=True, text=True,
                              timeout=120).stderr

    assert "llama_model_loader" not in run()
    shown = run("-v")
    assert shown.count("llama_model_loader: loaded meta data") == 1  # printed once, as llama.cpp prints it
