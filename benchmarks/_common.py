"""Shared bits of the benchmark scripts: device description, timing, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import jax
import numpy as np

import jaxphylo as jp


def device_record(name: str) -> dict:
    device = jax.devices()[0]
    return {"benchmark": name, "device": device.device_kind, "platform": device.platform,
            "jax": jax.__version__, "python": platform.python_version(), "rows": []}


def time_call(function, repeats: int) -> tuple[float, float]:
    """(first call seconds, which includes compilation; median of the next `repeats`)."""
    start = time.perf_counter()
    jax.block_until_ready(function())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(function())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def random_alignment(taxa: int, sites: int, alphabet: str, seed: int = 0) -> jp.Alignment:
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(("ACGT" if alphabet == "dna" else "ARNDCQEGHILKMFPSTWYV").encode(), np.uint8)
    cells = letters[rng.integers(0, len(letters), (taxa, sites))]
    sequences = tuple(row.tobytes().decode() for row in cells)
    return jp.Alignment(tuple(f"s{i}" for i in range(taxa)), sequences, jp.DNA if alphabet == "dna" else jp.PROTEIN)


def save(record: dict, out: str, stem: str) -> None:
    path = Path(out) / f"{stem}-{record['platform']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
