"""Packed weights cached next to the checkpoint, so that a second start reads them instead of packing.

Packing the talker and the predictor (reading bf16 from the checkpoint, converting to fp32,
quantizing into the kernels' tiles, ``vllm_omni.cpu.quant``) is most of a first start. The
result is saved as one safetensors file per format, ``DIR/.qwen3-tts-edge/packed-<fmt>.safetensors``,
whose metadata names what it was made from: the checkpoint's weight file (size and modification
time), the format and the packing layout (``quant.LAYOUT_VERSION``). On the next start with the
same format every packed matrix is read from it and the checkpoint's large matrices are never
read. A mix of formats (an int4 talker with an int8 predictor) reads each part from its format's
file and adds what it packs to it. A file that differs in any of these, or cannot be read, is packed again and replaced; the
file is written under a temporary name and renamed, so a start that is interrupted leaves no
half-written cache. Where the directory cannot be written the start is not cached (one line on
stderr says so). fp32 is not cached: its "packing" is the checkpoint's own values, converted, and
a copy would only double the disk it takes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from vllm_omni.tts.checkpoint import MODEL_FILE, Checkpoint

CACHE_DIR = ".qwen3-tts-edge"
CACHED_FORMATS = ("int8", "int4")


def cache_path(model_dir: Path, fmt: str) -> Path:
    return Path(model_dir) / CACHE_DIR / f"packed-{fmt}.safetensors"


def _source(ckpt: Checkpoint, fmt: str) -> dict[str, str]:
    """What a cache file must have been made from to be used (all values strings, as safetensors keeps them)."""
    from vllm_omni.cpu.quant import LAYOUT_VERSION

    st = (ckpt.path / MODEL_FILE).stat()
    return {"format": fmt, "layout_version": str(LAYOUT_VERSION), "weights_size": str(st.st_size),
            "weights_mtime_ns": str(st.st_mtime_ns)}


class PackedWeights:
    """A packer (``vllm_omni.cpu.quant.Packer``) that reads the cache when it is valid and records what it packs.

    ``hit`` says whether every matrix came from the cache; ``finish()``, once the kernels hold
    their copies, writes the cache after a start that had to pack and lets go of the file.
    """

    def __init__(self, path: Path, source: dict[str, str]):
        self.path, self.source = path, source
        self.matrices: dict[str, Any] = {}  # every matrix this start asked for, until saved
        self.read = self.made = 0  # matrices read from the cache, and packed now
        self._stored, self._layout = None, {}
        self.problem: str | None = None  # why an existing cache file was not used
        if path.is_file():
            self._open()

    @classmethod
    def open(cls, ckpt: Checkpoint, fmt: str) -> "PackedWeights":
        return cls(cache_path(ckpt.path, fmt), _source(ckpt, fmt))

    def _open(self) -> None:
        from safetensors import safe_open

        try:
            handle = safe_open(str(self.path), framework="pt")
            meta = handle.metadata() or {}
            layout = json.loads(meta.get("matrices", "{}"))
        except Exception as exc:  # noqa: BLE001 - an unreadable cache is rebuilt, never fatal
            self.problem = f"unreadable ({exc})"
            return
        stale = [k for k, v in self.source.items() if meta.get(k) != v]
        if stale:
            self.problem = f"made from something else ({', '.join(stale)} differ)"
            return
        self._stored, self._layout = handle, layout

    @property
    def hit(self) -> bool:
        return self.read > 0 and not self.made

    def __call__(self, name: str, fmt: str, make: Callable[[], Any]):
        from vllm_omni.cpu.quant import QuantMatrix, quantize

        if fmt != self.source["format"]:
            raise ValueError(f"packer for {self.source['format']} asked for {name!r} in {fmt}")
        if self._stored is not None and name in self._layout:
            rows, cols = self._layout[name]
            data = self._stored.get_tensor(f"{name}.data")
            scale = self._stored.get_tensor(f"{name}.scale") if f"{name}.scale" in self._stored.keys() else None
            self.read += 1
            m = QuantMatrix(fmt, data, scale, rows, cols)
        else:
            m = quantize(make(), fmt)
            self.made += 1
        self.matrices[name] = m
        return m

    def finish(self) -> Path | None:
        """Write the cache if this start packed anything; the path, or None if nothing was written. The
        file's other matrices are kept: a start that takes only its talker from this format (a mix,
        ``weight_choice``) leaves the predictor that another start packed in it."""
        from vllm_omni.cpu.quant import QuantMatrix

        if self.made and self._stored is not None:
            for name, (rows, cols) in self._layout.items():
                if name not in self.matrices:
                    keys = self._stored.keys()
                    scale = self._stored.get_tensor(f"{name}.scale") if f"{name}.scale" in keys else None
                    self.matrices[name] = QuantMatrix(self.source["format"], self._stored.get_tensor(f"{name}.data"),
                                                      scale, rows, cols)
        self._stored = None
        if not self.made:
            self.matrices.clear()
            return None
        from safetensors.torch import save_file

        tensors, layout = {}, {}
        for name, m in self.matrices.items():
            tensors[f"{name}.data"] = m.data.contiguous()
            if m.scale is not None:
                tensors[f"{name}.scale"] = m.scale.contiguous()
            layout[name] = [m.rows, m.cols]
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.part")
        try:
            self.path.parent.mkdir(exist_ok=True)
            save_file(tensors, str(tmp), metadata={**self.source, "matrices": json.dumps(layout)})
            os.replace(tmp, self.path)
        except OSError as exc:
            print(f"note: packed weights not cached ({self.path.parent}: {exc.strerror or exc})", file=sys.stderr)
            return None
        finally:
            if tmp.exists():  # after a failure or an interrupt (gone already after the rename)
                tmp.unlink()
            self.matrices.clear()  # the kernels hold their own copies; these would only keep memory
        return self.path
