"""A share's files hashed while DCP writes them, and checked while DCP reads them.

Each data file DCP writes for a share is hashed in blocks of ``BLOCK``
bytes as the bytes go out (``DigestingFileSystem``), and its record lists
one digest per block (``{"bytes": n, "block_bytes": BLOCK, "block_digest":
"xxh3", "blocks": [...]}``): no file is read back to be hashed.

At a restore DCP reads through ``VerifyingFileSystem``: every block a read
touches is read whole from the file, hashed, compared with its recorded
digest, and only then served, so DCP never parses a byte that differs from
what was written, and each byte is read from storage once. The blocks
ahead of the reader are read and hashed on a few threads (hashlib and file
reads release the GIL) while DCP deserializes the ones before. The digests
are in ``checkpoint.json``, whose own SHA-256 the coordinator records.

Both are DCP ``FileSystem``s, set as a ``FileSystemWriter``'s or
``FileSystemReader``'s ``fs``: DCP's own reading and writing is unchanged.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint.filesystem import FileSystem

BLOCK = 4 << 20
"""Bytes per digest: small enough that a rank reading part of a file reads
little more than it needs, large enough that a 10 GB share lists 2,500."""
AHEAD = 4
"""Blocks read and hashed ahead of the one DCP reads."""
KEEP = 4
"""Blocks last served, always kept: DCP's reader goes back (to an item's data, after its end)."""
CAPACITY = 4 * AHEAD
"""Blocks held per file at most (64 MiB), beyond the ``KEEP`` last served and the ``AHEAD`` started."""


class CorruptFile(OSError):
    """A block whose bytes differ from the digest recorded when it was written."""


class _Crc32:
    """zlib's CRC-32, incrementally, as hashlib's objects are used."""

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{self._crc:08x}"


_DIGESTS: dict[str, Callable[[], Any]] = {"xxh3": xxhash.xxh3_64, "crc32": _Crc32, "sha256": hashlib.sha256}
DIGEST = "xxh3"
"""What the writer records per block: XXH3-64 (the state checksum's hash,
fthsdp/agent/training/state/checksum.py). It catches what storage does to
bytes (torn writes, flipped bits, truncation) at 10-17 GB/s on one core
here, against 3 GB/s for CRC-32 (what checkpoints recorded before) and 1.6
for SHA-256, and a restore hashes every byte it reads. Not proof against a
hand that rewrites a file on purpose: storage permissions are
(``.metadata``, which is unpickled, keeps its SHA-256). A reader checks
every kind."""


def new_digest(kind: str) -> Any:
    """An incremental digest of ``kind`` (``update``, ``hexdigest``)."""
    try:
        return _DIGESTS[kind]()
    except KeyError:
        raise CorruptFile(f"unknown block digest {kind!r} in the checkpoint's record") from None


def describe(info: dict) -> dict:
    """A file's record as written in ``share.json``."""
    return {k: info[k] for k in ("bytes", "block_bytes", "block_digest", "blocks")}


def has_blocks(info: dict) -> bool:
    """Whether a file's record lists block digests (a share written before them has one SHA-256 of the whole file)."""
    return "blocks" in info


def block_digests(data: bytes | memoryview, kind: str) -> str:
    digest = new_digest(kind)
    digest.update(data)
    return digest.hexdigest()


class _DigestingStream(io.RawIOBase):
    """A file being written: every byte goes to the file and into its block's hash."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file = open(path, "wb")  # noqa: SIM115  (closed in close())
        self._written = 0
        self._block = new_digest(DIGEST)
        self._in_block = 0
        self.digests: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        self._file.write(view)
        at = 0
        while at < n:
            take = min(n - at, BLOCK - self._in_block)
            self._block.update(view[at : at + take])
            self._in_block += take
            at += take
            if self._in_block == BLOCK:
                self.digests.append(self._block.hexdigest())
                self._block, self._in_block = new_digest(DIGEST), 0
        self._written += n
        return n

    def tell(self) -> int:
        return self._written

    def fileno(self) -> int:
        self._file.flush()  # DCP fsyncs through it
        return self._file.fileno()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self.closed:
            return
        if self._in_block:
            self.digests.append(self._block.hexdigest())
            self._in_block = 0
        super().close()  # flushes through flush() first
        self._file.close()

    @property
    def nbytes(self) -> int:
        return self._written


class DigestingFileSystem(FileSystem):
    """DCP's file system, which hashes every file it writes in blocks (``written``: by file name)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, dict] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _DigestingStream(Path(path))
        try:
            yield stream
        finally:
            stream.close()
            with self._lock:  # DCP may write several files on threads
                self.written[Path(path).name] = {"bytes": stream.nbytes, "block_bytes": BLOCK,
                                                 "block_digest": DIGEST, "blocks": list(stream.digests)}


class _Blocks:
    """The verified blocks of one file: read and hashed ahead on the pool, kept a few at a time."""

    def __init__(self, path: Path, info: dict, pool: ThreadPoolExecutor, name: str,
                 found: Callable[[CorruptFile], None]) -> None:
        """``found``: told of a block that differs, before the reader hears of it."""
        self.path, self.name, self._found = path, name, found
        self.size = int(info["bytes"])
        self.block = int(info["block_bytes"])
        self.digests = list(info["blocks"])
        self.kind = str(info.get("block_digest"))
        new_digest(self.kind)
        if self.block <= 0 or len(self.digests) != -(-self.size // self.block):
            raise CorruptFile(f"{path}: its record lists {len(self.digests)} block digests for {self.size} bytes")
        self._fd = os.open(path, os.O_RDONLY)
        try:
            actual = os.fstat(self._fd).st_size
        except OSError:
            os.close(self._fd)
            raise
        if actual != self.size:
            os.close(self._fd)
            error = CorruptFile(f"{name} is corrupt (its size is {actual} bytes, {self.size} recorded)")
            found(error)
            raise error
        self._pool = pool
        self._pending: OrderedDict[int, Future[memoryview]] = OrderedDict()
        """Blocks read or being read, by index, least recently used first."""
        self._recent: OrderedDict[int, None] = OrderedDict()
        """The blocks served last, most recent last (a torch.load reads an item's end, then its start)."""
        self._free: deque[bytearray] = deque()
        """Buffers of blocks let go, for the next reads (fresh memory costs its page faults)."""

    def _read(self, index: int) -> memoryview:
        offset = index * self.block
        want = min(self.block, self.size - offset)
        try:
            buf = self._free.pop()
        except IndexError:
            buf = bytearray(self.block)
        view = memoryview(buf)[:want]
        got = os.preadv(self._fd, [view], offset)
        if got != want or block_digests(view, self.kind) != self.digests[index]:
            error = CorruptFile(f"{self.name} is corrupt (block {index} at byte {offset} differs from the one written)")
            self._found(error)
            raise error
        return view

    def get(self, index: int) -> memoryview:
        """Block ``index``, verified; the next ``AHEAD`` are started meanwhile."""
        ahead = range(index, min(index + AHEAD + 1, len(self.digests)))
        for i in ahead:
            if i not in self._pending:
                self._pending[i] = self._pool.submit(self._read, i)
        data = self._pending[index].result()
        self._pending.move_to_end(index)  # least recently used first
        self._recent[index] = None
        self._recent.move_to_end(index)
        while len(self._recent) > KEEP:
            self._recent.popitem(last=False)
        # torch.load reads an item's header, then its end (the zip's directory), then the data between:
        # the blocks served lately and those just started stay; past CAPACITY the least recently used go.
        excess = len(self._pending) - CAPACITY
        for old in [i for i in self._pending if i not in self._recent and i not in ahead][:max(0, excess)]:
            self._let_go(self._pending.pop(old))
        return data

    def _let_go(self, future: Future[memoryview]) -> None:
        if future.cancel() or not future.done() or future.exception() is not None:
            return  # cancelled before it ran, or still reading into its buffer: not reused
        self._free.append(future.result().obj)  # type: ignore[arg-type]

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        for future in self._pending.values():
            if not future.cancelled():
                try:
                    future.result()
                except OSError:
                    pass  # reported by the read that needed it, if any did
        self._pending.clear()
        self._free.clear()
        os.close(self._fd)


_LARGE = 1 << 16


def _copy(dest: memoryview, source: memoryview) -> None:
    """``dest[:] = source``; a large copy through torch, which lets go of the
    GIL meanwhile (the threads reading and hashing the next blocks need it)."""
    if len(source) < _LARGE:
        dest[:] = source
    else:
        torch.frombuffer(dest, dtype=torch.uint8).copy_(torch.frombuffer(source, dtype=torch.uint8))


class _VerifiedStream(io.RawIOBase):
    """A file DCP reads: every byte served comes from a block whose digest matched."""

    def __init__(self, blocks: _Blocks) -> None:
        super().__init__()
        self._blocks = blocks
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._blocks.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), self._blocks.size - self._pos))
        done = 0
        block = self._blocks.block
        while done < n:
            index, within = divmod(self._pos, block)
            data = self._blocks.get(index)
            take = min(n - done, len(data) - within)
            _copy(out[done : done + take], data[within : within + take])
            done += take
            self._pos += take
        return done

    def close(self) -> None:
        if not self.closed:
            self._blocks.close()
        super().close()


class VerifyingFileSystem(FileSystem):
    """DCP's file system for reading a checkpoint whose files list block
    digests (``files``: by path relative to ``folder``, as in
    ``checkpoint.json``); ``metadata``: the ``.metadata`` bytes already
    checked, served to DCP as they are (not read again). Files without block
    digests are read as DCP reads them: their caller checks them first."""

    def __init__(self, folder: Path, files: dict[str, dict], metadata: bytes | None = None, threads: int = 2) -> None:
        super().__init__()
        self._folder = Path(folder)
        self._files = files
        self._metadata = metadata
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="fthsdp-restore-read")
        self._lock = threading.Lock()
        self.corrupt: CorruptFile | None = None
        """The first block found to differ (DCP wraps the error it raised in its own)."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        path = Path(path)
        try:
            name = path.relative_to(self._folder).as_posix()
        except ValueError:
            name = path.name
        if "r" in mode and self._metadata is not None and name == ".metadata":
            yield io.BytesIO(self._metadata)
            return
        info = self._files.get(name)
        if "r" not in mode or info is None or not has_blocks(info):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _VerifiedStream(_Blocks(path, info, self._pool, str(path), self._found))
        try:
            yield stream
        finally:
            stream.close()

    def _found(self, error: CorruptFile) -> None:
        with self._lock:
            self.corrupt = self.corrupt or error

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
