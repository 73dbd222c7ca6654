"""A store URL as it may be shown: never its password, however it was written.

A password in a Redis URL should be percent-escaped, and often is not: a base64
password holds ``/``, a generated one ``#``, ``?``, ``@`` or a space, and a URL
parser then reads part of it as the host, the path or the fragment. So the userinfo
is taken to run from the scheme to the *last* ``@`` (a store URL has no ``@`` after
its host), and everything in it is masked, whatever the characters."""

from __future__ import annotations

from ...fsm.redact import MASK, redact

__all__ = ["masked", "userinfo"]


def _split(url: str) -> tuple[str, str, str] | None:
    """(what comes before the userinfo, the userinfo, the rest from its ``@``), or None
    when there is no ``@``. Without ``://`` (a mistyped scheme, ``redis:/:pw@host``) the
    userinfo starts after the first ``:``."""
    at = url.rfind("@")
    if at < 0:
        return None
    scheme_end = url.find("://")
    start = scheme_end + 3 if 0 <= scheme_end < at else url.find(":") + 1
    if not 0 < start <= at:
        start = 0
    return url[:start], url[start:at], url[at:]


def userinfo(url: str) -> list[str]:
    """The secrets a URL's userinfo holds: the whole of it and its ``user:password``
    parts (longest first); none when the URL has no userinfo."""
    parts = _split(url)
    if parts is None or not parts[1]:
        return []
    info = parts[1]
    found = {info, *info.split(":")}
    return sorted((s for s in found if s), key=len, reverse=True)


def masked(url: str) -> str:
    """`url` with its userinfo masked (``redis://***@host:6379/0``) and any secret query
    value (``?password=``) too."""
    parts = _split(url)
    if parts is not None:
        url = f"{parts[0]}{MASK}{parts[2]}"
    return redact(url)
