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


# ../shared/data beside the checkout; on the lent GPU machine a git-ignored copy travels as .devdata/
SHARED_DATA = next((p for p in (Path(__file__).resolve().parents[1].parent / "shared" / "data",
                                Path(__file__).resolve().parents[1] / ".devdata") if p.exists()),
                   Path("../shared/data"))


def real_case(name: str, model):
    """(tree, model, pattern data) of a real data set in ../shared/data, or None when absent.

    primates_mtDNA (12 x 413) gets a BIONJ tree; dengue352_hmc_clock (352 x 2,227)
    its time tree in years times 0.004 substitutions per site per year.
    """
    from jaxphylo.likelihood import pattern_data

    folder = SHARED_DATA / name
    if not folder.exists():
        return None
    alignment = jp.read_alignment(folder / "alignment.fasta")
    if (folder / "tree.nwk").exists():
        tree = jp.read_tree(folder / "tree.nwk")
        tree = tree.with_branch_lengths(tree.branch_lengths * 0.004)
    else:
        tree = jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa)
    return tree, model, pattern_data(alignment, tree)


def beagle_reference(tree, model, data, gradient: bool = False) -> dict | None:
    """BEAGLE 3.1 CPU SSE (one thread, float64) on the same P matrices and tip data, or None without it."""
    from _beagle import beagle_likelihood, tips_from_table

    lengths = tree.branch_lengths
    transition = np.asarray(model.transition_matrices(lengths))
    derivative = None
    if gradient:  # each P depends on its own branch only: one JVP with unit tangents gives every dP/dt
        derivative = np.asarray(jax.jvp(model.transition_matrices, (lengths,), (jax.numpy.ones_like(lengths),))[1])
    _, weights = model.rate_categories()
    tip_states, tip_partials = tips_from_table(np.asarray(data.tip_codes)[:-1], np.asarray(data.tip_table))
    return beagle_likelihood(transition, np.asarray(model.frequencies), np.asarray(weights), tip_states,
                             np.asarray(data.weights), np.asarray(tree.topology.parent_array),
                             transition_derivative=derivative, tip_partials=tip_partials)
