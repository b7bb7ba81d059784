"""Time the log-likelihood: median per call, compile time apart, peak memory, the memory floor, and BEAGLE.

    python benchmarks/likelihood.py [--quick] [--max-cells N] [--out DIR]

Cases are real data where ../shared/data has them (primates 12 x 413 with a BIONJ
tree, dengue 352 x 2,227 with its time tree) and random tip states on random
topologies otherwise (timing does not depend on the values). The floor is the
bytes the post-order pass must move at the least, writing and reading each
internal partial once, `2 (N-1) C P S bytes`, over the bandwidth measured here
by a large copy. BEAGLE: on the CPU, BEAGLE 3.1.2's SSE code (float64, one
thread, `apt-get install libhmsbeagle-dev`) runs in the same process run on the
same P matrices (benchmarks/_beagle.py), with and without rescaling (jaxphylo
always rescales; the ratio is against BEAGLE without rescaling, the stricter);
on a GPU, BEAGLE 4's CUDA figures on the same H100 as quoted in issue #19.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxphylo as jp
from jaxphylo.tree import branch_index
from jaxphylo.likelihood import PatternData, schedule_for, schedule_pattern_log_likelihoods

from _common import SHARED_DATA, beagle_reference, device_record, real_case, save, time_call

GPU_BEAGLE_MS = {("4", 1000, 1000): "0.3-0.5", ("4", 1000, 10000): "4.6-6.9 (10.7 rescaled)",
                 ("61", 62, 3600): "1.95"}
HKY_G4 = "HKY{2}+F{.3,.2,.2,.3}+G4{0.5}"
CASES = [("primates_mtDNA", 12, 413), ("4", 50, 1000), ("dengue352_hmc_clock", 352, 2227),
         ("4", 100, 1000), ("4", 100, 10000), ("4", 1000, 1000), ("4", 1000, 10000),
         ("4", 10000, 1000), ("4", 10000, 10000), ("61", 62, 3600)]


def measured_bandwidth() -> float:
    """Bytes per second of a device copy (read + write), median of several."""
    x = jnp.ones(1 << 27, jnp.float64)  # 1 GiB
    copy = jax.jit(lambda a: a * 1.0000001)
    copy(x).block_until_ready()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        copy(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * x.nbytes / statistics.median(times)


def make_case(states: str, taxa: int, patterns: int, seed: int = 0):
    """(tree, model, pattern data): a real data set by folder name, or random data with 4, 20 or 61 states."""
    if states not in ("4", "20", "61"):
        return real_case(states, jp.parse_model(HKY_G4))
    rng = np.random.default_rng(seed)
    names = [f"t{i}" for i in range(taxa)]
    tree = jp.random_topology_tree(names, seed=seed, mean_branch_length=0.05)
    if states == "4":
        model = jp.parse_model(HKY_G4)
    elif states == "20":
        model = jp.parse_model("LG+G4{0.5}")
    else:
        model = jp.parse_model("GY{kappa=2,omega=0.3}+FQ+G4{0.5}", genetic_code=1)
    s = model.alphabet.num_states
    codes = np.vstack([rng.integers(0, s, (taxa, patterns)), np.full((1, patterns), s)]).astype(np.int32)
    table = np.vstack([np.eye(s), np.ones((1, s))])
    data = PatternData(jnp.asarray(codes), jnp.asarray(table), jnp.asarray(rng.integers(1, 4, patterns).astype(float)))
    return tree, model, data


@eqx.filter_jit
def total_log_likelihood(model, branch_lengths, data, schedule, index, dtype, static_steps):
    per_pattern = schedule_pattern_log_likelihoods(model, branch_lengths, data, schedule, index, dtype, static_steps)
    return jnp.sum(data.weights.astype(dtype) * per_pattern)


def peak_bytes():
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"]
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # CPU: process high-water mark


def run_case(states, taxa, patterns, precision, bandwidth, repeats):
    tree, model, data = make_case(states, taxa, patterns)
    dtype = {"float64": jnp.float64, "float32": jnp.float32}[precision]
    schedule = schedule_for(tree, model, data, dtype)
    args = (model, tree.branch_lengths, data, schedule, branch_index(tree.topology), dtype, None)
    first, median = time_call(lambda: total_log_likelihood(*args), repeats)
    categories, s = 4, model.alphabet.num_states
    floor = 2 * (taxa - 1) * categories * patterns * s * jnp.dtype(dtype).itemsize / bandwidth
    return {
        "case": states, "states": model.alphabet.num_states, "taxa": taxa, "patterns": patterns, "precision": precision,
        "median_ms": 1e3 * median, "compile_s": first - median, "repeats": repeats,
        "floor_ms": 1e3 * floor, "over_floor": median / floor,
        "steps": int(schedule.steps.sum()), "peak_bytes": int(peak_bytes()), **beagle_columns(tree, model, data, precision),
    }


def beagle_columns(tree, model, data, precision):
    """BEAGLE's time for the same case: measured now on the CPU, quoted on a GPU (float64 only)."""
    if precision != "float64":
        return {"beagle_ms": None}
    if jax.default_backend() == "gpu":
        key = (str(model.alphabet.num_states), tree.num_tips, data.weights.shape[0])
        return {"beagle_ms": GPU_BEAGLE_MS.get(key), "beagle": "BEAGLE 4 CUDA, issue #19"}
    reference = beagle_reference(tree, model, data)
    if reference is None:
        return {"beagle_ms": None}
    # Without rescaling BEAGLE underflows on large trees; then only its rescaled time is a likelihood.
    finite = np.isfinite(reference["log_likelihood"])
    ms = reference["median_ms"] if finite else reference["median_ms_rescaled"]
    return {"beagle_ms": f"{ms:.4g}" + ("" if finite else " rescaled"),
            "beagle_rescaled_ms": reference["median_ms_rescaled"],
            "beagle": f"{reference['implementation']} {reference['version']}"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--max-cells", type=float, default=2e7, help="skip cases with taxa*patterns above this")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    device = jax.devices()[0]
    bandwidth = measured_bandwidth()
    rows = []
    header = f"{'case':>10} {'taxa':>6} {'patt':>6} {'prec':>8} {'median ms':>10} {'compile s':>9} {'floor ms':>9} {'x floor':>8} {'peak MiB':>9}  BEAGLE ms (ratio)"
    print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}; bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(header)
    for states, taxa, patterns in CASES:
        if taxa * patterns > args.max_cells or (args.quick and taxa * patterns > 1e6):
            continue
        if states not in ("4", "61") and not (SHARED_DATA / states).exists():
            print(f"skipping {states}: ../shared/data absent")
            continue
        for precision in ("float64", "float32"):
            row = run_case(states, taxa, patterns, precision, bandwidth, args.repeats)
            rows.append(row)
            beagle = row["beagle_ms"] or "-"
            if row["beagle_ms"]:
                low = float(beagle.split("-")[0].split()[0])
                beagle = f"{beagle} ({row['median_ms'] / low:.1f}x)"
            label = states if states in ("4", "61") else states.split("_")[0][:10]
            print(f"{label:>10} {taxa:>6} {patterns:>6} {precision:>8} {row['median_ms']:>10.3f} "
                  f"{row['compile_s']:>9.2f} {row['floor_ms']:>9.3f} {row['over_floor']:>8.1f} "
                  f"{row['peak_bytes'] / 2**20:>9.0f}  {beagle}", flush=True)
    record = device_record("likelihood")
    record.update(bandwidth_GBps=bandwidth / 1e9, rows=rows)
    save(record, args.out, "likelihood")


if __name__ == "__main__":
    main()
