"""Back large weight buffers with transparent huge pages (2 MiB) where the kernel allows it.

Why: a predictor pass streams 45 to 323 MB of weights, and with 4 KiB pages every 4 KiB of
that stream needs its own TLB entry. Where transparent huge pages are in ``madvise`` mode (the
development host's setting) nothing gets them unless asked, so the packed weights are asked
for them: ``MADV_HUGEPAGE`` on the 2 MiB-aligned interior of a buffer before it is first
touched, in a mapping of its own so that no page of it exists yet (``fresh_buffer``). The
bandwidth probes advise their buffers the same way, so the floor gets the same benefit.

Everything here is best effort: on other systems, or when the kernel refuses, the buffers
stay as they are and the functions report 0 bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14


@lru_cache(maxsize=1)
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _interior(address: int, nbytes: int) -> tuple[int, int]:
    """The 2 MiB-aligned part of [address, address + nbytes): (start, length), length 0 if none."""
    start = (address + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return start, max(0, end - start)


def advise_huge(address: int, nbytes: int) -> int:
    """Ask for huge pages on the aligned interior of a not yet touched buffer; bytes covered (0 if refused)."""
    madvise = _madvise()
    start, length = _interior(address, nbytes)
    if madvise is None or length == 0:
        return 0
    if madvise(start, length, MADV_HUGEPAGE) != 0:
        return 0
    return length


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def fresh_buffer(nbytes: int):
    """A uint8 tensor of ``nbytes`` over pages nothing has touched yet.

    Why: the advice only applies to pages faulted in after it. ``torch.empty`` of a few tens of
    MiB may come back as heap memory a freed tensor already touched (glibc reuses freed chunks
    below its mmap threshold), and those pages stay 4 KiB. On Linux the buffer is therefore a
    private anonymous mapping of its own (unmapped when the tensor is freed); elsewhere it is
    ``torch.empty``.
    """
    import torch

    nbytes = int(nbytes)
    if nbytes and sys.platform.startswith("linux"):
        import mmap

        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return torch.frombuffer(buf, dtype=torch.uint8)
    return torch.empty(nbytes, dtype=torch.uint8)


def huge_bytes(address: int, nbytes: int) -> int | None:
    """Bytes of [address, address + nbytes) backed by huge pages now (``/proc/self/smaps``); None where unknown."""
    end = address + nbytes
    total, overlap = 0, 0
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    overlap = max(0, min(hi, end) - max(lo, address))
                elif overlap and head == "AnonHugePages:":
                    total += min(overlap, int(line.split()[1]) * 1024)
    except OSError:
        return None
    return total


def into_huge_arena(items: list) -> tuple[object | None, list, int]:
    """Copy tensors and packed matrices into one buffer backed by huge pages.

    Separate tensors of a few MiB each rarely contain a whole aligned 2 MiB page, so they are
    copied into one arena, 2 MiB-aligned and advised before it is first touched; every item
    comes back as the same kind of object viewing the arena. Returns ``(arena, items,
    bytes_in_huge_pages)``, the last as the kernel reports it once the copies are made (the
    advised length where it cannot tell); the arena must be kept alive as long as the views
    are used.
    """
    import dataclasses

    import torch

    tensors = []
    for m in items:
        tensors += [m] if isinstance(m, torch.Tensor) else [t for t in (m.data, m.scale) if t is not None]
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += (_nbytes(t) + 63) // 64 * 64
    arena = fresh_buffer(total + HUGE_PAGE)
    base = (arena.data_ptr() + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE - arena.data_ptr()
    covered = advise_huge(arena.data_ptr() + base, total)

    def view(t, off):
        v = arena[base + off: base + off + _nbytes(t)].view(t.dtype).view(t.shape)
        v.copy_(t)
        return v

    views = [view(t, off) for t, off in zip(tensors, offsets)]
    measured = huge_bytes(arena.data_ptr(), arena.numel()) if covered else 0
    covered = covered if measured is None else measured
    out, i = [], 0
    for m in items:
        if isinstance(m, torch.Tensor):
            out.append(views[i])
            i += 1
        elif m.scale is None:
            out.append(dataclasses.replace(m, data=views[i]))
            i += 1
        else:
            out.append(dataclasses.replace(m, data=views[i], scale=views[i + 1]))
            i += 2
    return arena, out, covered
