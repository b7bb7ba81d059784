"""Memory probes: what a device has free, what this process holds, and the one line for running out."""

from __future__ import annotations

import os
import resource

import jax

from .._errors import JaxphyloError


class ResourceError(JaxphyloError):
    """A run that would not fit the memory of its devices."""


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def device_free_memory(device) -> tuple[int, int]:
    """`(free, total)` bytes of `device`: the allocator's limit on a GPU, available RAM on a CPU."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        limit = stats["bytes_limit"]
        if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0"):
            # The pool is allocated at start; when the device could not give all of it (a larger
            # XLA_PYTHON_CLIENT_MEM_FRACTION than it has), the pool is what there is.
            limit = min(limit, stats.get("pool_bytes", limit) or limit)
        return limit - stats.get("bytes_in_use", 0), limit
    return _host_available()


def _host_available() -> tuple[int, int]:
    """Available RAM, within the cgroup's limit when there is one (Slurm jobs, containers)."""
    info = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    free, total = info.get("MemAvailable", info["MemFree"]), info["MemTotal"]
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
        if limit != "max":
            free, total = min(free, int(limit) - used), min(total, int(limit))
    except OSError:
        pass
    return free, total


def resident_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_resident() -> None:
    """Start measuring the peak resident memory afresh (Linux >= 4.0: `/proc/self/clear_refs`)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def peak_resident_bytes() -> int:
    """This process's peak resident memory since `reset_peak_resident` (or since it started)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory_text() -> str:
    """The peak memory of this run so far: the device allocator's on a GPU, resident memory on a CPU."""
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats:
        return f"{gib(stats.get('peak_bytes_in_use', 0))} on {device}"
    return f"{gib(peak_resident_bytes())} resident (process)"


def out_of_memory_message(error: Exception) -> str | None:
    """The one line for XLA's RESOURCE_EXHAUSTED (an allocation that failed despite the estimate), else None."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    detail = next((line.strip() for line in text.splitlines() if "RESOURCE_EXHAUSTED" in line), text)[:200]
    return (f"out of memory on {jax.devices()[0]} ({detail}); 'jaxphylo ... --dry-run' shows what the run needs; "
            f"try --precision float32, fewer rate categories, or fewer chains/trees at once")
