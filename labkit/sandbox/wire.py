"""The byte channels of the sandbox's worker side: frames between the parent and a worker
(``struct '>II'``: header length, payload length; a UTF-8 JSON header; the payload bytes),
lines between a check's processes, and the few helpers every one of them uses.

Standard library only: the worker loads it by path (:mod:`labkit.sandbox.worker`); the parent's
pool (:mod:`labkit.sandbox.pool`) writes and reads the same frames with it.
"""

# Code here must survive anything a candidate or a probe raises (except BaseException), so
# that rule does not apply to this file.
# ruff: noqa: BLE001

from __future__ import annotations

import json
import os
import struct

FRAME = struct.Struct(">II")
MAX_REQUEST_INT_DIGITS = 20  # raw JSON ints an honest peer writes are below 2**53


def read_exact(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``, or ``None`` at end of file."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_into(fd: int, size: int) -> bytearray | None:
    """``size`` bytes from ``fd`` read straight into a new ``bytearray`` (no other copy is
    made in this process, so that zeroing it erases them), or ``None`` at end of file."""
    buffer = bytearray(size)
    done = 0
    with memoryview(buffer) as view:
        while done < size:
            with view[done:] as rest:
                n = os.readv(fd, [rest])
            if n == 0:
                return None
            done += n
    return buffer


def zero(buffer: bytearray) -> None:
    """Overwrite ``buffer`` in place."""
    buffer[:] = bytes(len(buffer))


def read_frame(fd: int) -> tuple[dict, bytearray] | None:
    """A frame from ``fd``: its JSON header and its payload (a ``bytearray``, see
    :func:`read_into`), or ``None`` at end of file."""
    head = read_exact(fd, FRAME.size)
    if head is None:
        return None
    n_header, n_payload = FRAME.unpack(head)
    header = read_exact(fd, n_header)
    payload = read_into(fd, n_payload) if header is not None else None
    if payload is None:
        return None
    return json.loads(header), payload



def encode_frame(header: dict, payload: bytes = b"") -> bytes:
    """One frame: the header's compact JSON and the payload, behind their lengths."""
    data = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(data), len(payload)) + data + payload


def take_frames(buffer: bytearray) -> list[tuple[dict, bytes]]:
    """The complete frames at the start of ``buffer``, removed from it (an incomplete last one
    stays for the next read)."""
    frames = []
    while len(buffer) >= FRAME.size:
        n_header, n_payload = FRAME.unpack_from(buffer)
        end = FRAME.size + n_header + n_payload
        if len(buffer) < end:
            break
        header = json.loads(buffer[FRAME.size:FRAME.size + n_header])
        frames.append((header, bytes(buffer[FRAME.size + n_header:end])))
        del buffer[:end]
    return frames


def write_frame(fd: int, header: dict, payload: bytes = b"") -> None:
    write_all(fd, encode_frame(header, payload))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LineReader:
    """Reads newline-terminated lines from a descriptor, each at most ``cap`` bytes."""

    def __init__(self, fd: int, cap: int):
        self.fd, self.cap = fd, cap
        self.buffer = bytearray()

    def line(self) -> bytes | None:
        """The next line (without its newline), ``None`` at end of file. Raises
        :class:`ValueError` for a line longer than the cap."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[:end + 1]
                return line
            if len(self.buffer) > self.cap:
                raise ValueError(f"a line longer than {self.cap} bytes")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


def parse_int(text: str) -> int:
    if len(text) > MAX_REQUEST_INT_DIGITS:
        raise ValueError("a raw JSON integer this long is never written by the peer")
    return int(text)



def describe(exc: BaseException) -> str:
    """``'Type: message'`` of an exception, defensively (its ``__str__`` is candidate code)."""
    try:
        name = type(exc).__name__
        text = str(exc)
        return (f"{name}: {text}" if text else str(name))[:300]
    except BaseException:
        return "exception that cannot be described"



def drain(fd: int, limit: int) -> bytes:
    """Whatever is readable on ``fd`` right now (up to ``limit`` bytes), without blocking:
    a process that outlived the child may still hold the pipe's write end."""
    os.set_blocking(fd, False)
    data = bytearray()
    while len(data) < limit:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data[:limit])
