"""`pydflash serve`: an HTTP server (Starlette on uvicorn) in front of one `Llama`."""

from .app import Server, serve

__all__ = ["Server", "serve"]
