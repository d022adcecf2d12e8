"""The address a browser or a scraper uses for a server bound to a host and port."""

from __future__ import annotations

__all__ = ["http_url"]


def http_url(host: str, port: int, path: str = "/") -> str:
    """``http://HOST:PORT/path``; a wildcard host is reached on loopback, an IPv6 one in brackets."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"
