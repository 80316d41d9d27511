"""What the store's operations return: plain dataclasses, no behaviour.

:class:`CacheInfo` (the settings pane), :class:`SaveResult`, :class:`FolderInfo`
(``lookup info``) and :class:`BuildResult`. Imports nothing of the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class CacheInfo:
    """One cache of a store (what the settings pane shows)."""

    path: str
    exists: bool
    file_bytes: int          #: size of the file on disk (0 when missing)
    ngrams: int              #: n-grams held in memory
    entries: int             #: (n-gram, token) pairs held in memory
    memory_bytes: int        #: its size as a file (20 B per n-gram + 8 B per entry)
    explicit: bool = False   #: given by --lookup-cache-* rather than the folder


@dataclass
class SaveResult:
    path: str
    skipped: bool = False          #: nothing new to save
    file_bytes: int = 0
    ngrams: int = 0
    entries: int = 0
    added_entries: int = 0         #: learned since the previous save (delta entries)
    pruned_entries: int = 0
    merged_other: bool = False     #: the file had changed on disk (another process) and was merged
    warnings: list[str] = field(default_factory=list)


@dataclass
class FolderInfo:
    """A cache folder, for ``lookup info``."""

    path: str
    fingerprint: str | None
    n_vocab: int | None
    models: list[dict]
    files: dict          #: name -> {"bytes", "ngrams", "entries", "error"}
    corrupt: list[str]   #: names of files moved aside


@dataclass
class BuildResult:
    path: str | None
    files: int
    tokens: int
    ngrams: int
    entries: int
    file_bytes: int
    seconds: float
