"""Refusing a model file before llama.cpp reads it: missing, a folder, not GGUF, a damaged
header, or cut short. Reads the file's header only (through :mod:`speculators.gguf_detect`)."""

from __future__ import annotations

import os
import struct

from .errors import ModelError

GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike) -> None:
    """Refuse files that are missing, empty, truncated or not GGUF, cheaply."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ModelError(f"model file not found: {p}")
    if os.path.isdir(p):
        raise ModelError(f"model path is a directory, not a GGUF file: {p}")
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file: {p}")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3) or n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise ModelError(f"unsupported or damaged GGUF header in {p}")
    if size < 1024:
        raise ModelError(f"model file is truncated or incomplete: {p} has only {size} bytes")
    _check_extent(p, size)


def _check_extent(p: str, size: int) -> None:
    """Refuse a file cut short, saying where it ends and where its header says it should.

    llama.cpp reports a file cut inside its metadata only as "failed to load
    model"; reading the header ourselves tells the two truncations apart. Only
    truncation is judged here: any other oddity is left to llama.cpp.
    """
    from ..gguf_detect import GGUFError, read_gguf, tensor_data_end
    try:
        info = read_gguf(p, tensors=True)
    except GGUFError as e:
        msg = str(e)
        if "past the end" in msg or msg.startswith("truncated"):
            raise ModelError(f"model file is truncated or incomplete: {p} ends at byte {size:,}, "
                             f"inside its GGUF header (metadata and tensor list)") from None
        return
    except OSError:
        return  # llama.cpp says why it cannot read it
    end = tensor_data_end(info)
    if end is not None and end > size:
        raise ModelError(f"model file is truncated or incomplete: {p}: its header declares tensor data "
                         f"up to byte {end:,} but the file has {size:,} bytes")

