"""Time the gradient: log-likelihood, custom-VJP gradient and plain autodiff, with peak memory.

    python benchmarks/gradient.py [--max-cells N] [--autodiff-max-cells N] [--out DIR]

The gradient is with respect to every branch length and every model parameter
(κ, frequencies, Gamma shape). Peak memory is XLA's own account of the compiled
program (arguments + outputs + temporaries, `Compiled.memory_analysis()`), so
each function gets its own figure on CPU and GPU alike; plain autodiff is not
run where that account exceeds the device's memory. The floor counts five
passes over the internal partials (post-order writes and reads them, the
pre-order pass reads them, writes and reads `q`): `5 (N-1) C P S bytes` over
the bandwidth measured here. BEAGLE 4.0.1's CUDA gradient on the same H100
(pre-order partials plus edge derivatives, 4 categories, no rescaling) is the
reference named in issue #3; TreeFlow's C++ op (20 ms, 1,024 taxa x 2,000
sites, 4-core Xeon) the CPU one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

from jaxphylo.tree import branch_index
from jaxphylo.likelihood import schedule_for, schedule_pattern_log_likelihoods
from jaxphylo.likelihood.kernels import exact_steps

from _common import SHARED_DATA, beagle_reference, device_record, save
from likelihood import make_case, measured_bandwidth

GPU_BEAGLE_MS = {("4", 1000, 1000): "13", ("4", 1000, 10000): "110-136", ("61", 62, 3600): "11.4",
             ("61", 128, 1000): "7.8"}
CASES = [("primates_mtDNA", 12, 413), ("4", 50, 1000), ("dengue352_hmc_clock", 352, 2227), ("4", 100, 1000), ("4", 100, 10000), ("4", 1000, 1000), ("4", 1000, 10000),
         ("4", 10000, 1000), ("4", 10000, 10000), ("61", 62, 3600), ("61", 128, 1000), ("4", 1024, 2000)]


def objective(index, static_steps, autodiff=False):
    def total(model, branch_lengths, data, schedule):
        per_pattern = schedule_pattern_log_likelihoods(model, branch_lengths, data, schedule, index, jnp.float64,
                                               static_steps, autodiff)
        return jnp.sum(data.weights * per_pattern)
    return total


def timed(function, args, repeats):
    """(compiled program, compile seconds, median seconds, peak bytes)."""
    dynamic, static = eqx.partition(args, eqx.is_array)
    jitted = jax.jit(lambda d: function(*eqx.combine(d, static)))
    start = time.perf_counter()
    compiled = jitted.lower(dynamic).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    peak = memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit", float("inf"))
    if peak > limit:
        return compile_s, None, peak
    jax.block_until_ready(compiled(dynamic))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(dynamic))
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times), peak


def run_case(states, taxa, patterns, bandwidth, repeats, autodiff_max_cells):
    tree, model, data = make_case(states, taxa, patterns)
    schedule = schedule_for(tree, model, data, jnp.float64)
    args = (model, tree.branch_lengths, data, schedule)
    steps = exact_steps(schedule)
    index = branch_index(tree.topology)
    row = {"case": states, "states": model.alphabet.num_states, "taxa": taxa, "patterns": patterns,
           "precision": "float64", "repeats": repeats}
    functions = {
        "loglik": objective(index, None),
        "preorder": lambda m, b, d, s: jax.grad(objective(index, None), argnums=(0, 1))(m, b, d, s),
        "autodiff": lambda m, b, d, s: jax.grad(objective(index, steps, True), argnums=(0, 1))(m, b, d, s),
    }
    for name, function in functions.items():
        if name == "autodiff" and taxa * patterns > autodiff_max_cells:
            row[f"{name}_ms"], row[f"{name}_peak_bytes"] = None, None
            continue
        compile_s, median, peak = timed(function, args, repeats)
        row[f"{name}_ms"] = None if median is None else 1e3 * median
        row[f"{name}_compile_s"] = compile_s
        row[f"{name}_peak_bytes"] = peak
    floor = 5 * (taxa - 1) * 4 * patterns * model.alphabet.num_states * 8 / bandwidth
    row["floor_ms"] = 1e3 * floor
    if jax.default_backend() == "gpu":
        row["beagle_gradient_ms"] = GPU_BEAGLE_MS.get((states, taxa, patterns))
    else:  # BEAGLE 3.1 has no pre-order API: upper partials by ordinary operations, then edge derivatives
        reference = beagle_reference(tree, model, data, gradient=True)
        row["beagle_gradient_ms"] = None if reference is None else f"{reference['gradient_median_ms']:.4g}"
        row["beagle_loglik_ms"] = None if reference is None else reference["median_ms"]
    return row


def with_ratio(beagle: str | None, ours_ms: float) -> str:
    """'BEAGLE ms (ours / BEAGLE)', against the low end of a quoted range."""
    if not beagle:
        return "-"
    return f"{beagle} ({ours_ms / float(beagle.split('-')[0].split()[0]):.2f}x)"


def fmt(value, spec=">9.2f"):
    return format(value, spec) if value is not None else format("-", spec[:-2].rstrip("."))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-cells", type=float, default=2.1e6, help="skip cases with taxa*patterns above this")
    parser.add_argument("--autodiff-max-cells", type=float, default=1.1e7)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    device = jax.devices()[0]
    bandwidth = measured_bandwidth()
    print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}; bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"{'case':>10} {'taxa':>6} {'patt':>6} | {'logL ms':>9} {'VJP ms':>9} {'AD ms':>9} | {'VJP/logL':>8} "
          f"{'AD/VJP':>7} | {'logL MiB':>9} {'VJP MiB':>9} {'AD MiB':>9} | {'floor ms':>8}  BEAGLE grad ms")
    rows = []
    for states, taxa, patterns in CASES:
        if taxa * patterns > args.max_cells:
            continue
        if states not in ("4", "61") and not (SHARED_DATA / states).exists():
            print(f"skipping {states}: ../shared/data absent")
            continue
        row = run_case(states, taxa, patterns, bandwidth, args.repeats, args.autodiff_max_cells)
        rows.append(row)
        ratio = row["preorder_ms"] / row["loglik_ms"]
        speedup = row["autodiff_ms"] / row["preorder_ms"] if row["autodiff_ms"] else None
        mib = lambda key: row[key] / 2**20 if row.get(key) else None
        label = states if states in ("4", "61") else states.split("_")[0][:10]
        print(f"{label:>10} {taxa:>6} {patterns:>6} | {fmt(row['loglik_ms'])} {fmt(row['preorder_ms'])} "
              f"{fmt(row['autodiff_ms'])} | {ratio:>8.2f} {fmt(speedup, '>7.1f')} | {fmt(mib('loglik_peak_bytes'), '>9.0f')} "
              f"{fmt(mib('preorder_peak_bytes'), '>9.0f')} {fmt(mib('autodiff_peak_bytes'), '>9.0f')} | "
              f"{row['floor_ms']:>8.2f}  {with_ratio(row['beagle_gradient_ms'], row['preorder_ms'])}", flush=True)
    record = device_record("gradient")
    record.update(bandwidth_GBps=bandwidth / 1e9,
                  peak_memory="XLA memory_analysis: arguments + outputs + temporaries", rows=rows)
    save(record, args.out, "gradient")


if __name__ == "__main__":
    main()
