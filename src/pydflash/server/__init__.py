"""`pydflash serve`: an HTTP server (Starlette on uvicorn) in front of one `Llama`."""

from .app import MAX_BODY, Server, serve

__all__ = ["MAX_BODY", "Server", "serve"]
