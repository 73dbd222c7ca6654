"""Store URLs as they may be shown: never with a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """`url` with its password replaced (``redis://user:***@host:6379/0``)."""
    try:
        parts = urlsplit(url)
        password, host, port = parts.password, parts.hostname or "", parts.port
    except ValueError:  # a malformed port or netloc: show no netloc at all
        return url.split("://", 1)[0] + "://***" if "@" in url else url
    if password is None:
        return url
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}"
    if port is not None:
        netloc += f":{port}"
    return urlunsplit(parts._replace(netloc=netloc))
