"""Store URLs as they may be shown: never with a password."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

#: Query parameters that carry a secret: redis-py reads ``?password=`` (and a
#: ``username`` beside it) as the credentials; the rest are masked as well, by name.
_SECRET_PARAM = re.compile(r"(?i)([^&=]*(?:pass|secret|token|key)[^&=]*=)[^&]*")


def redact_url(url: str) -> str:
    """`url` with its password replaced (``redis://user:***@host:6379/0``), in the
    netloc or in a query parameter (``?password=***``)."""
    try:
        parts = urlsplit(url)
        password, host, port = parts.password, parts.hostname or "", parts.port
    except ValueError:  # a malformed port or netloc: show no netloc at all
        return url.split("://", 1)[0] + "://***" if "@" in url or "?" in url else url
    if parts.query:
        parts = parts._replace(query=_SECRET_PARAM.sub(r"\1***", parts.query))
    if password is not None:
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}"
        if port is not None:
            netloc += f":{port}"
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)
