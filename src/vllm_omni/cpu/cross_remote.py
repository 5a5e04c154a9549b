"""The whole generation loop on the ARM kernels: its native calls run by an aarch64 build under qemu.

Why: a kernel proven alone (``vllm_omni.cpu.cross``) does not prove the codes. Greedy codes are
what a user hears, and they come from a loop (``tts.batch``: the talker's rows, c0, the
predictor's 15 passes, the next input) that chains every kernel many times. Here that loop runs
unchanged in Python, and each of its native calls runs in an ARM process: the driver's
``--serve`` mode (``csrc/driver/vo_driver.cpp``) holds memory and calls the kernels there.

``on_arm(generator, target, cpu)`` swaps the generator's native library for an
``ArmLibrary`` while it is open. The ``ArmLibrary`` copies every buffer the generator's packed
stacks own (weights, norms, rope tables, workspaces, KV caches) into the ARM process once, and
answers the calls the loop makes (``vo_stack_forward_rows``, ``vo_predictor_frames``) with
the same arguments: each call's structures are written there afresh with their pointers moved
to the copies, its inputs are copied in and its outputs back. A KV cache made for a new stream
(``NativeStack.new_cache``) lives in the ARM process from its first call on. ``aarch64`` and
``x86-64`` lay these structures out alike (LP64, natural alignment), so their bytes carry over.
"""

from __future__ import annotations

import bisect
import ctypes
import struct
import subprocess
from contextlib import contextmanager
from typing import Any, Iterator

from vllm_omni.cpu.cross import QEMU, EmulationError, build

FN_FORWARD_ROWS, FN_PREDICTOR_FRAMES, FN_ISA = 0, 1, 2
_ALLOC, _WRITE, _READ, _CALL = 1, 2, 3, 4
# the local library's answers that are the same on ARM (constants of the shared source)
CONSTANTS = ("vo_max_tokens", "vo_max_streams", "vo_workspace_bytes", "vo_version")


def _pointer_counts():
    from vllm_omni.cpu import native

    return {(native.VoStack, "layers"): "n_layers"}  # a pointer field -> the field that counts its items


class ArmLibrary:
    """The native calls of generation, run by the ARM driver on qemu's ``cpu`` (see the module doc)."""

    def __init__(self, target: str, cpu: str, local: ctypes.CDLL, owners: list[Any]):
        binary = build(target)
        self.target, self.cpu, self.local = target, cpu, local
        self._proc = subprocess.Popen([QEMU, "-cpu", cpu, str(binary), "--serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._starts: list[int] = []  # local address ranges copied there, sorted: (start, end, remote)
        self._ranges: list[tuple[int, int, int]] = []
        self._scratch, self._scratch_bytes, self._used = 0, 0, 0
        self.calls = 0
        for start, nbytes in _storages(owners):
            self._copy_range(start, nbytes)

    # --- the protocol --------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
        except BrokenPipeError:
            self._fail("stopped")

    def _recv(self, n: int) -> bytes:
        try:
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._fail("stopped")
        data = self._proc.stdout.read(n)
        if len(data) != n:
            self._fail("stopped mid-answer")
        return data

    def _fail(self, what: str):
        self._proc.kill()
        err = self._proc.stderr.read().decode(errors="replace").strip()[-2000:]
        code = self._proc.wait()
        sigill = " (SIGILL: an instruction this core lacks)" if code == -4 else ""
        raise EmulationError(f"the ARM driver ({self.target}) on {self.cpu} {what}, exit {code}{sigill}: {err}")

    def alloc(self, nbytes: int) -> int:
        self._send(struct.pack("<IQ", _ALLOC, nbytes))
        return struct.unpack("<Q", self._recv(8))[0]

    def write(self, addr: int, data: bytes) -> None:
        self._send(struct.pack("<IQQ", _WRITE, addr, len(data)) + data)

    def read(self, addr: int, nbytes: int) -> bytes:
        self._send(struct.pack("<IQQ", _READ, addr, nbytes))
        return self._recv(nbytes)

    def call(self, fn: int, *args: int) -> int:
        self._send(struct.pack(f"<III{len(args)}Q", _CALL, fn, len(args), *(a & (1 << 64) - 1 for a in args)))
        self.calls += 1
        return struct.unpack("<q", self._recv(8))[0]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send(struct.pack("<I", 0))
                self._proc.stdin.close()
            except (BrokenPipeError, EmulationError):
                pass
            self._proc.wait(timeout=60)

    def vo_isa(self) -> int:
        return self.call(FN_ISA)

    # --- memory: local ranges and their copies there ---------------------------------------------

    def _copy_range(self, start: int, nbytes: int, data: bool = True) -> int:
        remote = self.alloc(nbytes)
        if data:
            self.write(remote, ctypes.string_at(start, nbytes))
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._ranges.insert(i, (start, start + nbytes, remote))
        return remote

    def _find(self, p: int) -> int | None:
        i = bisect.bisect(self._starts, p) - 1
        if i >= 0 and self._ranges[i][0] <= p < self._ranges[i][1]:
            return self._ranges[i][2] + p - self._ranges[i][0]
        return None

    def translate(self, p: int | None, what: str) -> int:
        """The address there of local address ``p`` (0 for null)."""
        if not p:
            return 0
        remote = self._find(p)
        if remote is None:
            raise EmulationError(f"{what} points at memory the ARM process was not given (0x{p:x})")
        return remote

    def _cache(self, p: int, nbytes: int) -> int:
        """A KV cache's address there; one not seen before gets its memory there (a new stream's)."""
        remote = self._find(p)
        return remote if remote is not None else self._copy_range(p, nbytes, data=False)

    # --- one call's memory there ---------------------------------------------------------------

    def _begin(self, nbytes: int) -> None:
        if nbytes > self._scratch_bytes:
            self._scratch_bytes = max(nbytes, 2 * self._scratch_bytes)
            self._scratch = self.alloc(self._scratch_bytes)
        self._used = 0

    def _put(self, data: bytes) -> int:
        addr = self._scratch + self._used
        self._used += (len(data) + 63) // 64 * 64
        if self._used > self._scratch_bytes:
            raise AssertionError("a call's scratch was sized too small")  # _begin's sizes are wrong
        if data:
            self.write(addr, data)
        return addr

    def _in(self, p: int, nbytes: int) -> int:
        return self._put(ctypes.string_at(p, nbytes))

    def _out(self, nbytes: int) -> int:
        return self._put(bytes(nbytes))

    def _back(self, remote: int, p: int, nbytes: int) -> None:
        ctypes.memmove(p, self.read(remote, nbytes), nbytes)

    def _struct(self, obj: ctypes.Structure | ctypes.Array) -> int:
        """``obj`` (a structure or an array of them) written there with its pointers moved; its address there."""
        raw = bytearray(ctypes.string_at(ctypes.addressof(obj), ctypes.sizeof(obj)))
        self._relocate(obj, raw, 0)
        return self._put(bytes(raw))

    def _relocate(self, obj, raw: bytearray, base: int) -> None:
        if isinstance(obj, ctypes.Array):
            size = ctypes.sizeof(obj._type_)
            for i in range(len(obj)):
                self._relocate(obj[i], raw, base + i * size)
            return
        counts = _pointer_counts()
        for name, ftype in obj._fields_:
            off = base + getattr(type(obj), name).offset
            value = getattr(obj, name)
            if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
                self._relocate(value, raw, off)
            elif ftype is ctypes.c_void_p:
                struct.pack_into("<Q", raw, off, self.translate(value, f"{type(obj).__name__}.{name}"))
            elif isinstance(ftype, type) and issubclass(ftype, ctypes._Pointer):
                count = counts.get((type(obj), name))
                if count is None:
                    raise TypeError(f"{type(obj).__name__}.{name}: no count known for this pointer")
                addr = ctypes.cast(value, ctypes.c_void_p).value
                items = (ftype._type_ * getattr(obj, count)).from_address(addr) if addr else None
                struct.pack_into("<Q", raw, off, 0 if items is None else self._struct(items))

    def _kv(self, kv: int, entries: int, stack) -> int:
        """The table of ``entries`` KV caches (keys, values per layer) at ``kv``, moved there."""
        n = entries * stack.n_layers * 2
        local = (ctypes.c_void_p * n).from_address(kv)
        nbytes = stack.kv_heads * stack.max_pos * stack.head_dim * (2 if stack.kv_f16 else 4)
        return self._put(struct.pack(f"<{n}Q", *(self._cache(p, nbytes) for p in local)))

    # --- the calls -----------------------------------------------------------------------------

    def vo_stack_forward_rows(self, stack, x, t, pos, kv, out, head, logits, head_rows) -> int:
        st = stack._obj
        hd = None if head is None else head._obj
        last = t if head_rows <= 0 or head_rows > t else head_rows
        h = st.hidden
        io = 4 * t * h
        self._begin(2 * io + 4 * t + 8 * t * st.n_layers * 2 + (0 if hd is None else 4 * last * hd.rows)
                    + 64 * 64 + 64 * st.n_layers * 4)
        args = [self._struct(st), self._in(x, io), t, self._in(pos, 4 * t), self._kv(kv, t, st), self._out(io),
                0 if hd is None else self._struct(hd), 0, head_rows]
        if hd is not None and logits:
            args[7] = self._out(4 * last * hd.rows)
        rc = self.call(FN_FORWARD_ROWS, *args)
        if rc == 0:
            self._back(args[5], out, io)
            if args[7]:
                self._back(args[7], logits, 4 * last * hd.rows)
        return rc

    def vo_predictor_frames(self, stack, heads, groups, emb, ht, proj, proj_bias, b, kv, past_hidden, c0_embed,
                            greedy, temperature, top_k, uniforms, keys, codes, sums, logits, scratch) -> int:
        if uniforms is not None or logits is not None:
            raise NotImplementedError("vo_predictor_frames on ARM takes noise keys and returns no logits")
        st = stack._obj
        vocab = heads[0].rows
        io = 4 * b * ht
        self._begin(4 * io + 8 * b + 8 * b * groups + 12 * b * vocab + 8 * b * st.n_layers * 2
                    + ctypes.sizeof(heads) + 64 * 64 + 64 * st.n_layers * 4)
        temp_bits = struct.unpack("<I", struct.pack("<f", temperature))[0]
        args = [self._struct(st), self._struct(heads), groups, self.translate(emb, "the codebook embeddings"), ht,
                self._struct(proj._obj), self.translate(proj_bias, "the projection's bias"), b, self._kv(kv, b, st),
                self._in(past_hidden, io), self._in(c0_embed, io), greedy, temp_bits, top_k, 0, self._in(keys, 8 * b),
                self._out(8 * b * groups), self._out(io), 0, self._out(12 * b * vocab)]
        rc = self.call(FN_PREDICTOR_FRAMES, *args)
        if rc == 0:
            self._back(args[16], codes, 8 * b * groups)
            self._back(args[17], sums, io)
        return rc

    def __getattr__(self, name: str):
        if name in CONSTANTS:
            return getattr(self.local, name)
        raise AttributeError(f"{name} is not run on ARM here (ArmLibrary runs the generation loop's calls only)")


def _storages(owners: list[Any]) -> list[tuple[int, int]]:
    """(start, bytes) of every tensor storage ``owners`` reach through the package's own objects."""
    import torch

    seen: dict[int, int] = {}
    visited: set[int] = set()

    def walk(obj: Any) -> None:
        if id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            s = obj.untyped_storage()
            if s.nbytes():
                seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item)
        elif type(obj).__module__.startswith("vllm_omni.cpu") and hasattr(obj, "__dict__"):
            for item in vars(obj).values():
                walk(item)

    for owner in owners:
        walk(owner)
    return sorted(seen.items())


@contextmanager
def calling(generator, lib) -> Iterator[Any]:
    """While open, ``generator`` (a ``tts.generate.CodeGenerator``) makes its native calls to ``lib``: another
    build of the kernels on this host (``native.load("generic")``), or an ``ArmLibrary``."""
    holders = [generator.talker, generator.talker.native, generator.predictor, generator.predictor.native]
    saved = [h.lib for h in holders]
    try:
        for h in holders:
            h.lib = lib
        yield lib
    finally:
        for h, old in zip(holders, saved):
            h.lib = old


@contextmanager
def on_arm(generator, target: str, cpu: str) -> Iterator[ArmLibrary]:
    """While open, ``generator`` runs its native calls on ARM: ``target``'s build on qemu's ``cpu``."""
    arm = ArmLibrary(target, cpu, generator.talker.lib, [generator.talker, generator.predictor])
    try:
        with calling(generator, arm):
            yield arm
    finally:
        arm.close()
