"""What a GGUF file is, read from its header alone (no weights, no llama.cpp).

Three things, for the draft model picker and the settings pane:

* :func:`types_from_gguf` - the model-based speculative types a file
  supports, decided as llama.cpp's ``common_speculative_types_from_gguf``
  decides it: architecture ``dflash`` is a DFlash drafter, or a DSpark one
  when it has the Markov head tensor ``markov_w1.weight``; any other
  architecture is an MTP model when its last block has the tensor
  ``blk.{block_count-1}.nextn.eh_proj.weight``; otherwise nothing.
* :func:`gguf_summary` - architecture, size, name, vocabulary size and
  block count, or why the file cannot be read.
* :func:`read_gguf` - the parsed header itself (metadata and tensor
  infos), used by the two above and by the metadata-only vocabulary check
  in :mod:`speculators.compat`.

Why a reader of our own: the ``gguf`` package's ``GGUFReader`` builds a
numpy view per element of every array, which takes ~13 s on this machine
for one file with a 262k-token vocabulary - too slow for a picker that
lists several files. This reader walks the same format with ``struct``
over an ``mmap`` (~0.1 s for the same file; string arrays are only
materialised when asked for). The test suite checks that it reads
hand-built files exactly as ``GGUFReader`` does.

A worked example on a file made with the ``gguf`` package:

>>> import os, tempfile, numpy as np, gguf
>>> path = os.path.join(tempfile.mkdtemp(), "d.gguf")
>>> w = gguf.GGUFWriter(path, "dflash")
>>> w.add_block_count(1)
>>> w.add_tensor("markov_w1.weight", np.zeros(4, dtype=np.float32))
>>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
>>> types_from_gguf(path)
[<SpecType.DRAFT_DSPARK: 'draft-dspark'>]
>>> s = gguf_summary(path)
>>> (s.readable, s.architecture, s.block_count, s.vocab_size)
(True, 'dflash', 1, None)
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from .types import SpecType

__all__ = ["GGUFError", "GGUFInfo", "GGUFStringArray", "GGUFSummary", "TensorInfo", "gguf_summary",
           "read_gguf", "tensor_data_end", "types_from_gguf", "types_from_info", "has_mtp_heads", "has_markov_head",
           "is_dflash_drafter", "GGUF_TYPE", "GGML_BLOCK"]


class GGUFError(ValueError):
    """The file is not a GGUF file we can read; the message says why."""


#: GGUF value type ids (``enum gguf_type``)
GGUF_TYPE = {
    "UINT8": 0, "INT8": 1, "UINT16": 2, "INT16": 3, "UINT32": 4, "INT32": 5, "FLOAT32": 6,
    "BOOL": 7, "STRING": 8, "ARRAY": 9, "UINT64": 10, "INT64": 11, "FLOAT64": 12,
}
T_UINT32 = GGUF_TYPE["UINT32"]
T_STRING = GGUF_TYPE["STRING"]
T_ARRAY = GGUF_TYPE["ARRAY"]
T_BOOL = GGUF_TYPE["BOOL"]

#: scalar types: struct format
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_SCALAR = {t: struct.Struct(f) for t, f in _SCALAR_FMT.items()}
_NP_DTYPE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
             10: "<u8", 11: "<i8", 12: "<f8"}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")

#: sanity limits (a damaged header must not make us allocate the moon)
_MAX_COUNT = 1 << 31
_DEFAULT_ALIGNMENT = 32


class GGUFStringArray:
    """A string array left in the file until asked for (e.g. 262k token texts).

    ``raw()`` returns the elements as ``bytes`` exactly as stored;
    ``len()`` is known without reading them.
    """

    __slots__ = ("_mm", "_offset", "_count", "_cache")

    def __init__(self, mm: mmap.mmap, offset: int, count: int):
        self._mm = mm
        self._offset = offset
        self._count = count
        self._cache: list[bytes] | None = None

    def __len__(self) -> int:
        return self._count

    def raw(self) -> list[bytes]:
        if self._cache is None:
            mm, off, unpack = self._mm, self._offset, _U64.unpack_from
            out: list[bytes] = []
            ap = out.append
            for _ in range(self._count):
                (n,) = unpack(mm, off)
                off += 8
                ap(mm[off:off + n])
                off += n
            self._cache = out
        return self._cache

    def __iter__(self) -> Iterator[str]:
        return (b.decode("utf-8", "replace") for b in self.raw())

    def __getitem__(self, i: int) -> str:
        return self.raw()[i].decode("utf-8", "replace")


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass
class GGUFInfo:
    """A parsed GGUF header.

    ``kv`` maps keys to values: ``str``, ``int``, ``float``, ``bool``;
    arrays of numbers as numpy arrays, arrays of strings as
    :class:`GGUFStringArray`, other arrays as lists. ``kv_types`` maps keys
    to ``(type, element type or None)``. ``tensors`` is None when tensor
    infos were not read. ``kv_spans`` maps keys to the byte range of their
    record in the file, ``infos_span`` is that of the tensor infos (with
    ``tensors``): what a copy that edits the metadata keeps as it is.
    """

    path: str
    version: int
    n_tensors: int
    n_kv: int
    file_size: int
    kv: dict[str, Any] = field(default_factory=dict)
    kv_types: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] | None = None
    data_offset: int | None = None
    kv_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    infos_span: tuple[int, int] | None = None

    @property
    def architecture(self) -> str | None:
        a = self.kv.get("general.architecture")
        return a if self.kv_types.get("general.architecture", (None,))[0] == T_STRING else None

    @property
    def alignment(self) -> int:
        """The data section's alignment (``general.alignment``, else GGUF's default)."""
        return self.get_int("general.alignment") or _DEFAULT_ALIGNMENT

    def get_int(self, key: str) -> int | None:
        t = self.kv_types.get(key)
        if t is None or t[0] not in (0, 1, 2, 3, 4, 5, 10, 11):
            return None
        return int(self.kv[key])


def read_gguf(path: str | os.PathLike, tensors: bool = True) -> GGUFInfo:
    """Parse the header of a GGUF file (metadata, and tensor infos if asked).

    Raises :class:`GGUFError` for anything that is not a readable GGUF v2/v3
    file, and ``OSError`` when the file cannot be opened.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _HEADER.size:
            raise GGUFError("file too small to be GGUF")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    # the mmap stays valid after the file object is closed; lazily read
    # string arrays keep it alive until they are dropped.
    try:
        return _parse(mm, p, size, tensors)
    except (struct.error, IndexError, OverflowError) as e:
        raise GGUFError(f"truncated or damaged GGUF header ({e})") from None


def _read_str(mm: mmap.mmap, o: int, size: int) -> tuple[bytes, int]:
    """A GGUF string at ``o``: its bytes and the offset after it."""
    (n,) = _U64.unpack_from(mm, o)
    o += 8
    if o + n > size:
        raise GGUFError("damaged GGUF header (string past the end of the file)")
    return mm[o:o + n], o + n


def _read_array(mm: mmap.mmap, off: int, size: int, key: str) -> tuple[Any, int, int]:
    """An array value at ``off`` (after its value type): ``(value, element type, offset after)``;
    strings are left in the file (:class:`GGUFStringArray`), numbers read as a numpy array."""
    et, count = struct.unpack_from("<IQ", mm, off)
    off += 12
    if count > _MAX_COUNT:
        raise GGUFError(f"damaged GGUF header (array {key} too long)")
    if et == T_STRING:
        value: Any = GGUFStringArray(mm, off, count)
        unpack = _U64.unpack_from
        for _ in range(count):
            (n,) = unpack(mm, off)
            off += 8 + n
        if off > size:
            raise GGUFError(f"damaged GGUF header (array {key} past the end of the file)")
        return value, et, off
    if et not in _NP_DTYPE:
        raise GGUFError(f"unsupported array element type {et} for {key}")
    import numpy as np
    dt = np.dtype(_NP_DTYPE[et])
    nbytes = dt.itemsize * count
    if off + nbytes > size:
        raise GGUFError(f"damaged GGUF header (array {key} past the end of the file)")
    value = np.frombuffer(mm, dtype=dt, count=count, offset=off)
    if et == T_BOOL:
        value = value.astype(bool)
    return value, et, off + nbytes


def _read_value(mm: mmap.mmap, off: int, size: int, key: str, vt: int) -> tuple[Any, int | None, int]:
    """The value of type ``vt`` at ``off``: ``(value, element type or None, offset after)``."""
    if vt == T_ARRAY:
        return _read_array(mm, off, size, key)
    if vt == T_STRING:
        b, off = _read_str(mm, off, size)
        return b.decode("utf-8", "replace"), None, off
    if vt in _SCALAR:
        s = _SCALAR[vt]
        (value,) = s.unpack_from(mm, off)
        return value, None, off + s.size
    raise GGUFError(f"unknown value type {vt} for {key}")


def _read_tensor_infos(mm: mmap.mmap, off: int, size: int, n_tensors: int) -> tuple[dict[str, TensorInfo], int]:
    """The ``n_tensors`` tensor infos at ``off``, by name, and the offset after them."""
    tens: dict[str, TensorInfo] = {}
    for _ in range(n_tensors):
        nb, off = _read_str(mm, off, size)
        (n_dims,) = _U32.unpack_from(mm, off)
        off += 4
        if n_dims > 8:
            raise GGUFError("damaged GGUF header (tensor with too many dimensions)")
        shape = struct.unpack_from(f"<{n_dims}Q", mm, off)
        off += 8 * n_dims
        gtype, t_off = struct.unpack_from("<IQ", mm, off)
        off += 12
        name = nb.decode("utf-8", "replace")
        if name in tens:
            raise GGUFError(f"duplicate tensor {name}")
        tens[name] = TensorInfo(name, tuple(int(d) for d in shape), int(gtype), int(t_off))
    return tens, off


def _parse(mm: mmap.mmap, path: str, size: int, want_tensors: bool) -> GGUFInfo:
    """The header in ``mm``: the metadata (each key's value, type and byte span), then, if
    ``want_tensors``, the tensor infos and where the tensor data starts."""
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(mm, 0)
    if magic != b"GGUF":
        raise GGUFError("not a GGUF file (bad magic)")
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version}")
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise GGUFError("damaged GGUF header (absurd counts)")
    info = GGUFInfo(path=path, version=version, n_tensors=n_tensors, n_kv=n_kv, file_size=size)
    off = _HEADER.size
    for _ in range(n_kv):
        start = off
        kb, off = _read_str(mm, off, size)
        key = kb.decode("utf-8", "replace")
        (vt,) = _U32.unpack_from(mm, off)
        value, et, off = _read_value(mm, off + 4, size, key, vt)
        info.kv_types[key] = (vt, et)
        if key in info.kv:
            raise GGUFError(f"duplicate key {key}")
        info.kv[key] = value
        info.kv_spans[key] = (start, off)

    if want_tensors:
        infos_start = off
        info.tensors, off = _read_tensor_infos(mm, off, size, n_tensors)
        info.infos_span = (infos_start, off)
        align = info.alignment
        if align > 0:
            info.data_offset = (off + align - 1) // align * align
    return info


# -- tensor data extent ---------------------------------------------------------

#: ggml tensor types: (elements per block, bytes per block), as ggml's type traits say
#: (checked against the ``gguf`` package's ``GGML_QUANT_SIZES`` by the tests)
GGML_BLOCK: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18),
}


def tensor_data_end(info: GGUFInfo) -> int | None:
    """The byte offset where the last tensor's data ends, as the header declares it.

    None when the tensor infos were not read or a tensor has a type this table
    does not know (the caller then cannot tell, and should not guess).
    """
    if info.tensors is None or info.data_offset is None:
        return None
    end = info.data_offset
    for t in info.tensors.values():
        blk = GGML_BLOCK.get(t.ggml_type)
        if blk is None:
            return None
        n = 1
        for d in t.shape:
            n *= d
        per, size = blk
        end = max(end, info.data_offset + t.offset + (n + per - 1) // per * size)
    return end


# -- speculative types ------------------------------------------------------

def types_from_gguf(path: str | os.PathLike) -> list[SpecType]:
    """The model-based speculative types ``path`` supports (llama.cpp's rule).

    Returns ``[]`` for unreadable files and for plain models. Where the
    reference would abort (a non-``dflash`` file without a ``uint32``
    ``{arch}.block_count``), this returns ``[]``.
    """
    try:
        info = read_gguf(path, tensors=True)
    except (GGUFError, OSError):
        return []
    return types_from_info(info)


def types_from_info(info: GGUFInfo) -> list[SpecType]:
    """:func:`types_from_gguf` for a header already read (with tensor infos): the declared
    types whose descriptor's ``detect`` recognises it (:func:`has_mtp_heads`,
    :func:`is_dflash_drafter` and :func:`has_markov_head` for llama.cpp's)."""
    if info.architecture is None:
        return []
    from .descriptor import descriptors
    return [d.type for d in descriptors() if d.detect is not None and d.detect(info)]


def is_dflash_drafter(info: GGUFInfo) -> bool:
    """Architecture ``dflash``: a DFlash or DSpark block drafter."""
    return info.architecture == "dflash"


def has_markov_head(info: GGUFInfo) -> bool:
    """DSpark's Markov head (what tells a DSpark drafter from a DFlash one)."""
    return "markov_w1.weight" in (info.tensors or {})


def has_mtp_heads(info: GGUFInfo) -> bool:
    """A model (not a DFlash drafter) whose last block has the NextN/MTP tensor."""
    arch = info.architecture
    if arch is None or is_dflash_drafter(info):
        return False
    key = f"{arch}.block_count"
    if info.kv_types.get(key, (None,))[0] != T_UINT32:
        return False
    last = (int(info.kv[key]) - 1) & 0xFFFFFFFF  # uint32 arithmetic, as in C
    return f"blk.{last}.nextn.eh_proj.weight" in (info.tensors or {})


# -- summary for the picker ---------------------------------------------------

#: llama_ftype names for the common values of ``general.file_type``
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}


@dataclass
class GGUFSummary:
    """What the model picker shows for one file."""

    path: str
    size_bytes: int
    readable: bool
    error: str | None = None
    architecture: str | None = None
    name: str | None = None
    vocab_size: int | None = None
    block_count: int | None = None
    file_type: str | None = None
    #: split models: how many files (``split.count``), and this one's index
    split_count: int | None = None
    split_no: int | None = None
    #: model-based speculative types this file supports (draft-mtp, ...)
    spec_types: list[SpecType] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["spec_types"] = [t.value for t in self.spec_types]
        return d


def gguf_summary(path: str | os.PathLike, info: GGUFInfo | None = None) -> GGUFSummary:
    """Read what the picker needs from ``path``; never raises for a bad file."""
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
    except OSError as e:
        return GGUFSummary(p, 0, False, f"cannot read: {e.strerror or e}")
    try:
        if info is None:
            info = read_gguf(p, tensors=True)
    except GGUFError as e:
        return GGUFSummary(p, size, False, str(e))
    except OSError as e:
        return GGUFSummary(p, size, False, f"cannot read: {e.strerror or e}")
    arch = info.architecture
    s = GGUFSummary(p, size, True, architecture=arch)
    name = info.kv.get("general.name")
    s.name = name if isinstance(name, str) else None
    tokens = info.kv.get("tokenizer.ggml.tokens")
    if isinstance(tokens, GGUFStringArray):
        s.vocab_size = len(tokens)
    elif arch is not None and info.get_int(f"{arch}.vocab_size") is not None:
        s.vocab_size = info.get_int(f"{arch}.vocab_size")
    if arch is not None:
        s.block_count = info.get_int(f"{arch}.block_count")
    ft = info.get_int("general.file_type")
    if ft is not None:
        s.file_type = FILE_TYPES.get(ft, f"type {ft}")
    s.split_count = info.get_int("split.count")
    s.split_no = info.get_int("split.no")
    if info.tensors is not None:
        s.spec_types = types_from_info(info)
    return s

