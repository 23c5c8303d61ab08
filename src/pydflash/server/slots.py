"""llama-server's slot endpoints: ``GET /slots`` and ``POST /slots/{id}?action=save|restore|erase``
(save and restore: ``{"filename": ...}`` in ``--slot-save-path``). Every call that may wait
(for the pair's lock, which a prefill holds; for the disk) runs off the event loop; a slot
file is a regular file of the slot folder, never a link out of it or a FIFO."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ..errors import PyDFlashError, SlotBusyError
from .http import error_response, json_response, read_body

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["MAX_SLOT_BODY", "SlotRoutes"]

MAX_SLOT_BODY = 64 * 1024  # a slot action's body names a file: no more is needed
# characters a slot file name may not hold (llama.cpp's fs_validate_filename refuses them too)
_BAD_NAME_CHARS = frozenset('/\\:*?"<>|') | {chr(c) for c in range(32)} | {chr(127)}
_OFF = "This server does not support slots endpoint. Start it with `--slots`"


class SlotRoutes:
    """The endpoints of one server's slots; ``folder``: ``--slot-save-path`` (None: no save or restore)."""

    def __init__(self, srv: ServerState, on: bool, folder: Path | None) -> None:
        self.srv = srv
        self.on = on
        self.folder = folder

    async def slots(self, request: Request) -> Response:
        if not self.on:
            return error_response(501, _OFF)
        srv = self.srv
        return json_response(await anyio.to_thread.run_sync(srv.llm.slots, limiter=srv.side_threads))

    async def action(self, request: Request) -> Response:
        if not self.on:
            return error_response(501, _OFF)
        llm = self.srv.llm
        action = request.query_params.get("action", "")
        try:
            slot = int(request.path_params["id_slot"])
            if not 0 <= slot < llm.n_parallel:
                raise ValueError
        except ValueError:
            return error_response(400, f"id_slot must be a slot in [0, {llm.n_parallel})", "id_slot")
        if action not in ("save", "restore", "erase"):
            return error_response(400, "action must be save, restore or erase", "action")
        raw = await read_body(request, MAX_SLOT_BODY, self.srv.timeout)
        if isinstance(raw, Response):
            return raw
        if action == "erase":
            try:
                n = await anyio.to_thread.run_sync(llm.erase_slot, slot, limiter=self.srv.side_threads)
            except SlotBusyError as e:
                return error_response(503, str(e))
            except PyDFlashError as e:
                return error_response(500, str(e))
            return json_response({"id_slot": slot, "n_erased": n})
        if self.folder is None:
            return error_response(501, "slot save and restore need --slot-save-path")
        name = _file_name(raw)
        if name is None:
            return error_response(400, "'filename' must be a plain file name", "filename")
        try:
            out = await anyio.to_thread.run_sync(self._file, action, slot, name, limiter=self.srv.side_threads)
        except ValueError as e:
            return error_response(400, self._name_only(str(e)))
        except SlotBusyError as e:
            return error_response(503, str(e))
        except PyDFlashError as e:
            return error_response(500, self._name_only(str(e)))
        except OSError as e:
            return error_response(400 if action == "restore" else 500, f"{e.strerror or e}: {name}")
        return json_response(out)

    def _name_only(self, message: str) -> str:
        """``message`` with the slot folder cut from the paths it holds: a client names a
        file, and where the server keeps it is not the client's to know."""
        return message.replace(f"{self.folder}{os.sep}", "")

    def _file(self, action: str, slot: int, name: str) -> dict[str, Any]:
        """Save or restore ``slot`` (in a worker thread): llama-server's reply."""
        assert self.folder is not None
        llm, path = self.srv.llm, self.folder / name
        _check_file(path)
        t0 = time.perf_counter()
        (llm.save_slot if action == "save" else llm.load_slot)(slot, path)
        ms = (time.perf_counter() - t0) * 1e3
        n = len(llm.pair.sequence(slot).tokens)
        # llama-server's field names
        tokens, size, took = (
            ("n_saved", "n_written", "save_ms") if action == "save" else ("n_restored", "n_read", "restore_ms")
        )
        return {"id_slot": slot, "filename": name, tokens: n, size: path.stat().st_size, "timings": {took: ms}}


def _file_name(raw: bytes) -> str | None:
    """The body's ``filename`` when it is a plain file name, else None."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return None
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str):
        return None
    try:
        size = len(name.encode("utf-8"))  # a lone surrogate ("\ud800") names no file
    except UnicodeEncodeError:
        return None
    ok = 0 < size <= 255 and name not in (".", "..") and not _BAD_NAME_CHARS.intersection(name)
    return name if ok else None


def _check_file(path: Path) -> None:
    """ValueError when ``path`` is there but no regular file (a link may lead out of the slot
    folder; a FIFO's open waits for a writer); a missing one a save creates, a restore refuses."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path.name} is not a regular file")
