"""The persistent compilation cache: the programs XLA compiles are kept on disk, so that a program compiled once
on this machine is loaded (milliseconds), not compiled again (up to seconds each), by every later run.

jaxphylo turns JAX's persistent cache on when it is imported, in the user's cache folder by the platform's
convention: `$XDG_CACHE_HOME/jaxphylo/xla` (default `~/.cache/jaxphylo/xla`) on Linux, `~/Library/Caches/jaxphylo/xla`
on macOS, `%LOCALAPPDATA%\\jaxphylo\\Cache\\xla` on Windows. `JAXPHYLO_CACHE_DIR=PATH` moves it,
`JAXPHYLO_CACHE_DIR=off` turns it off. A cache the user configured in JAX (`JAX_COMPILATION_CACHE_DIR`,
`jax.config.update("jax_compilation_cache_dir", ...)` or `jax_enable_compilation_cache=False`) is left exactly as it
is. Every program is cached, however fast it compiled (JAX keeps only those over 1 s by default): a command compiles
dozens of small programs, together seconds.

JAX keys every entry by the program, the jaxlib version, the backend and device kind, the XLA flags and the compile
options, so one folder is safe to share across versions and devices: a changed version misses and compiles again, it
never loads a program built for another. JAX's key does not name the host's processor, and XLA compiles CPU programs
for the instructions of the processor it runs on (a home folder shared by the nodes of a cluster may see several):
programs go to a subfolder per processor kind (`host_tag()`). The folder is kept under a size cap (`JAXPHYLO_CACHE_MAX_SIZE`, default
`DEFAULT_MAX_BYTES`; e.g. `500M`, `4G`): when a process that wrote entries exits, the least recently used entries
are removed until the folder fits. (JAX's own cap, `jax_compilation_cache_max_size`, needs the `filelock` package
and a lock on every read; this one costs nothing while running.)
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .._errors import InputError

ENVIRONMENT = "JAXPHYLO_CACHE_DIR"
SIZE_ENVIRONMENT = "JAXPHYLO_CACHE_MAX_SIZE"
OFF = ("off", "0", "no", "none", "false")
DEFAULT_MAX_BYTES = 2 * 1024 ** 3
ENTRY_SUFFIX = "-cache"  # JAX's file name for an entry: KEY-cache (and KEY-atime beside it when JAX evicts)
AUTOTUNE = "xla_gpu_per_fusion_autotune_cache_dir"  # XLA's GPU autotuning results, which JAX keeps in the folder
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}

_enabled: Path | None = None  # the folder this process turned on (None: not by jaxphylo)
_wrote = False


def default_cache_dir() -> Path:
    """The folder for jaxphylo's compiled programs by the platform's convention (whether or not it is in use)."""
    home = Path.home()
    if sys.platform == "darwin":
        base = home / "Library" / "Caches" / "jaxphylo"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", home / "AppData" / "Local")) / "jaxphylo" / "Cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "jaxphylo"
    return base / "xla"


def cache_dir() -> Path | None:
    """The folder jaxphylo's cache uses: `JAXPHYLO_CACHE_DIR` when set, else `default_cache_dir()`; None when that
    variable turns it off."""
    value = os.environ.get(ENVIRONMENT)
    if value is None or value.strip() == "":
        return default_cache_dir()
    if value.strip().lower() in OFF:
        return None
    return Path(value).expanduser()


def max_cache_bytes() -> int:
    """The size cap: `JAXPHYLO_CACHE_MAX_SIZE` (bytes, or with a K/M/G/T suffix), else `DEFAULT_MAX_BYTES`."""
    value = os.environ.get(SIZE_ENVIRONMENT, "").strip().upper().removesuffix("B").removesuffix("I")
    if not value:
        return DEFAULT_MAX_BYTES
    number, unit = (value[:-1], value[-1]) if value[-1] in _UNITS else (value, "")
    try:
        return int(float(number) * _UNITS[unit])
    except ValueError:
        raise InputError(f"{SIZE_ENVIRONMENT}={os.environ[SIZE_ENVIRONMENT]!r}: expected a size such as 2G or 500M")


def host_tag() -> str:
    """The processor kind this process compiles for: the machine type and a digest of the CPU's model and
    instruction-set flags (Linux: /proc/cpuinfo), e.g. `x86_64-3f2a9c1b7d20`."""
    import hashlib
    import platform

    described = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            described += "".join(line for line in cpuinfo if line.startswith(("model name", "flags", "Features"))
                                 and line not in described)
    except OSError:
        pass
    return f"{platform.machine()}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"


def _configured_by_user() -> bool:
    import jax

    return jax.config.jax_compilation_cache_dir is not None or not jax.config.jax_enable_compilation_cache


def enable_compilation_cache() -> Path | None:
    """Turn JAX's persistent cache on in `cache_dir()` for this process, unless it is off or the user configured
    JAX's cache themselves. Returns the folder in use (None: no cache, or one that jaxphylo does not manage).

    Takes effect if called before this process's first compilation (JAX decides once whether to use a cache):
    importing jaxphylo calls it."""
    global _enabled
    import jax

    if _enabled is not None:
        return _enabled
    folder = cache_dir()
    if folder is None or _configured_by_user():
        return None
    folder = folder / host_tag()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: run without a cache rather than fail
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Cache every program: JAX's default keeps only those compiling for over a second, and a command's many small
    # programs (each 20-300 ms on a CPU) add up to most of its compile time.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.monitoring.register_event_listener(_note_write)
    atexit.register(_trim_after_writes)
    _enabled = folder
    return folder


def enabled_cache_dir() -> Path | None:
    """The folder that `enable_compilation_cache` turned on in this process, or None."""
    return _enabled


def _note_write(event: str, **kwargs) -> None:
    global _wrote
    if event == "/jax/compilation_cache/cache_misses":  # a miss is compiled and written
        _wrote = True


def _trim_after_writes() -> None:
    if _wrote and _enabled is not None:
        try:
            trim_cache(_enabled.parent, max_cache_bytes())  # the cap is on the folder, every processor kind's
        except (OSError, InputError):  # never fail a finished run over its cache
            pass


@dataclass(frozen=True)
class CacheInfo:
    folder: Path
    entries: int
    bytes: int


def _entries(folder: Path) -> list[os.DirEntry]:
    """JAX's entries in `folder` and in its subfolders one level down (one per processor kind)."""
    if not folder.is_dir():
        return []
    found = []
    with os.scandir(folder) as listing:
        for entry in listing:
            if entry.name.endswith(ENTRY_SUFFIX) and entry.is_file():
                found.append(entry)
            elif entry.is_dir() and entry.name != AUTOTUNE:
                found += _entries_here(Path(entry.path))
    return found


def _entries_here(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as listing:
        return [entry for entry in listing if entry.name.endswith(ENTRY_SUFFIX) and entry.is_file()]


def cache_info(folder: Path) -> CacheInfo:
    """How many compiled programs `folder` holds (its processor kinds' subfolders included), and their size."""
    entries = _entries(folder)
    return CacheInfo(folder, len(entries), sum(entry.stat().st_size for entry in entries))


def trim_cache(folder: Path, max_bytes: int) -> int:
    """Remove the least recently used entries of `folder` (by access time, else modification time) until it holds
    at most `max_bytes`. Returns the number removed."""
    stats = sorted(((max(s.st_atime, s.st_mtime), s.st_size, entry.path)
                    for entry in _entries(folder) for s in (entry.stat(),)))
    total = sum(size for _, size, _ in stats)
    removed = 0
    for _, size, path in stats:
        if total <= max_bytes:
            break
        _remove_entry(Path(path))
        total -= size
        removed += 1
    return removed


def _remove_entry(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name.removesuffix(ENTRY_SUFFIX) + "-atime").unlink(missing_ok=True)


def clear_cache(folder: Path) -> int:
    """Remove every compiled program in `folder` and XLA's GPU autotuning results there (nothing else in the folder
    is touched). Returns the number of programs removed."""
    import shutil

    entries = _entries(folder)
    for entry in entries:
        _remove_entry(Path(entry.path))
    for autotune in [folder / AUTOTUNE, *folder.glob(f"*/{AUTOTUNE}")]:
        shutil.rmtree(autotune, ignore_errors=True)
    return len(entries)
