"""Reading a user's text file (a policy, a fault script, a trace) without trusting it.

Only a regular file is read (a named pipe would block forever, ``/dev/zero``
never ends), at most `limit` bytes of it, and it must be UTF-8 (a leading byte order
mark is dropped): each failure is one `UnreadableFile` whose text says what is wrong
(never a raw ``UnicodeDecodeError`` or ``MemoryError``).
"""

from __future__ import annotations

import os
import stat

__all__ = ["UnreadableFile", "read_text"]

#: What a file that is not regular is, for messages.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(ValueError):
    """A file that cannot be read as text: `reason` says why (no path in it).
    `line` is the 1-based line of a byte that is not UTF-8, if that is the reason."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.line = line


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """The file's text: a regular file of at most `limit` bytes of UTF-8."""
    # O_NONBLOCK: opening a named pipe must not wait for a writer (we refuse it below)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise UnreadableFile(e.strerror or type(e).__name__) from None
    except ValueError:  # os.open refuses a NUL in the path before asking the system
        raise UnreadableFile("the path holds a NUL character") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # checked before fdopen, which raises for a directory
            kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
            raise UnreadableFile(f"{kind}, not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UnreadableFile(e.strerror or type(e).__name__) from None
    if len(data) > limit:
        raise UnreadableFile(f"larger than {_size(limit)}, the most fallgate reads")
    try:
        # a byte order mark (editors on Windows write one) is not part of the text
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UnreadableFile(
            f"not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): is it a binary file?",
            line,
        ) from None
