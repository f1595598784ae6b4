"""Bounded opens of the small files a checkpoint reader reads whole (markers, the
manifest's bytes for its SHA-256): a regular file or a refusal at once, never a wait on
a FIFO or an endless read of a device. No h5py. Local; blocks for its own disk I/O.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["open_regular"]


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading, refusing at once anything but a regular file (after
    links): a FIFO is opened without waiting for a writer (``O_NONBLOCK``), then
    refused, and a device (``/dev/zero``, endless) is never read. Local.

    Raises:
        OSError: the OS refused, or ``path`` is not a regular file (``EINVAL``, naming
            what it is).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a file")
            raise OSError(errno.EINVAL, f"{what}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
