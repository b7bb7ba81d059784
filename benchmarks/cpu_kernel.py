"""Time the C++ CPU kernel (XLA FFI custom calls) next to the JAX kernel and BEAGLE, in one run.

    python benchmarks/cpu_kernel.py [--rounds 3] [--repeats 20] [--float32] [--no-jax] [--no-beagle]
                                    [--only 12x413,50x1000]

HKY{2}+F{.3,.2,.2,.3}+G4{0.5}, per-pattern rescaling; P matrices and tip data
prepared once, outside the timed calls. Columns, median ms per call (best median
of `--rounds` rounds of `--repeats` calls, since other work may share the CPU):

- post: `kernels.cpu.post_order`, log L per pattern keeping the partials buffer.
- L: `kernels.cpu.log_likelihoods`, log L per pattern keeping no partials.
- post+pre: value and gradient (w.r.t. P, pi, w) through
  `kernels.cpu.pattern_log_likelihoods_stored`: post_order, then
  pre_order_cotangents reading the partials back.
- grad: the same through `kernels.cpu.pattern_log_likelihoods`: log_likelihoods,
  then `cotangents`, which recomputes the partials per block of patterns in cache.
- jax L / jax grad: `kernels.pattern_log_likelihoods` (jitted), value and value+gradient.
- BEAGLE L / BEAGLE grad: 3.1 CPU SSE, one thread, float64, with rescaling, on the
  same P matrices (benchmarks/_beagle.py); gradient = its edge derivatives.

Cases: primates 12 x 413 (BIONJ tree), random 50 x 1,000, dengue 352 x 2,227
(time tree x 0.004), random 1,024 x 2,000. `JAXPHYLO_CPU_THREADS=1` for one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxphylo as jp  # noqa: E402
from jaxphylo.tree import branch_index  # noqa: E402
from jaxphylo.likelihood import kernels  # noqa: E402
from jaxphylo.likelihood import PatternData, kernel_arrays, layout_lengths, schedule_for  # noqa: E402

from _common import beagle_reference, real_case  # noqa: E402

HKY_G4 = "HKY{2}+F{.3,.2,.2,.3}+G4{0.5}"
CASES = [("primates_mtDNA", 12, 413), ("random", 50, 1000), ("dengue352_hmc_clock", 352, 2227),
         ("random", 1024, 2000)]


def random_case(taxa: int, patterns: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    tree = jp.random_topology_tree([f"t{i}" for i in range(taxa)], seed=seed, mean_branch_length=0.05)
    model = jp.parse_model(HKY_G4)
    codes = np.vstack([rng.integers(0, 4, (taxa, patterns)), np.full((1, patterns), 4)]).astype(np.int32)
    table = np.vstack([np.eye(4), np.ones((1, 4))])
    data = PatternData(jnp.asarray(codes), jnp.asarray(table), jnp.asarray(rng.integers(1, 4, patterns).astype(float)))
    return tree, model, data


def best_median(function, rounds: int, repeats: int) -> float:
    """Best over rounds of the median milliseconds of `repeats` calls (after one warm-up call)."""
    jax.block_until_ready(function())
    best = float("inf")
    for _ in range(rounds):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(function())
            times.append(time.perf_counter() - start)
        best = min(best, statistics.median(times))
    return 1e3 * best


def run_case(name, taxa, patterns, args):
    case = random_case(taxa, patterns) if name == "random" else real_case(name, jp.parse_model(HKY_G4))
    if case is None:
        print(f"skipping {name}: ../shared/data absent")
        return None
    tree, model, data = case
    dtype = jnp.float32 if args.float32 else jnp.float64
    schedule = schedule_for(tree, model, data, dtype)
    lengths = layout_lengths(tree.branch_lengths, branch_index(tree.topology), schedule)
    transition, pi, w, codes, table = kernel_arrays(model, lengths, data, dtype)
    codes, table = jnp.asarray(codes), jnp.asarray(table)
    weights = jnp.asarray(data.weights, dtype)
    taxa, patterns = tree.num_tips, codes.shape[1]

    def value(kernel):
        return jax.jit(lambda t, p, c: jnp.sum(weights * kernel(t, p, c, codes, table, schedule)))

    def value_and_grad(kernel):
        return jax.jit(jax.value_and_grad(lambda t, p, c: jnp.sum(weights * kernel(t, p, c, codes, table, schedule)),
                                          argnums=(0, 1, 2)))

    row = {"case": name.split("_")[0], "taxa": taxa, "patterns": patterns}
    repeats = max(3, min(args.repeats, int(args.repeats * 2e5 / (taxa * patterns)) or 3))
    post = jax.jit(lambda t, p, c: kernels.cpu.post_order(t, codes, table, schedule, p, c)[0])
    likelihood = value(kernels.cpu.pattern_log_likelihoods)
    stored, recomputed = (value_and_grad(kernels.cpu.pattern_log_likelihoods_stored),
                          value_and_grad(kernels.cpu.pattern_log_likelihoods))
    row["post"] = best_median(lambda: post(transition, pi, w), args.rounds, repeats)
    row["L"] = best_median(lambda: likelihood(transition, pi, w), args.rounds, repeats)
    row["post+pre"] = best_median(lambda: stored(transition, pi, w), args.rounds, repeats)
    row["grad"] = best_median(lambda: recomputed(transition, pi, w), args.rounds, repeats)
    ffi_value = float(likelihood(transition, pi, w))
    if not args.no_jax:
        jax_value = value(kernels.pattern_log_likelihoods)
        jax_grad = value_and_grad(kernels.pattern_log_likelihoods)
        slow = max(3, repeats // 10)
        row["jax L"] = best_median(lambda: jax_value(transition, pi, w), args.rounds, slow)
        row["jax grad"] = best_median(lambda: jax_grad(transition, pi, w), args.rounds, slow)
        assert abs(float(jax_value(transition, pi, w)) - ffi_value) <= (1e-5 if args.float32 else 1e-9) * abs(
            ffi_value), "FFI and JAX log-likelihoods differ"
    if not args.no_beagle and not args.float32:
        reference = None
        for gradient in (True, False):  # the harness's unscaled gradient can underflow to a NaN it cannot print
            try:
                reference = beagle_reference(tree, model, data, gradient=gradient)
                break
            except Exception as error:  # noqa: BLE001 - a reference that fails leaves its columns empty
                print(f"BEAGLE (gradient={gradient}) failed on {name} {taxa}x{patterns}: {error!r}")
        if reference is not None:
            row["BEAGLE L"] = reference["median_ms_rescaled"]
            row["BEAGLE grad"] = reference.get("gradient_median_ms_rescaled")
            assert abs(reference["log_likelihood"] - ffi_value) <= 1e-6 * abs(ffi_value), \
                ("BEAGLE and FFI log-likelihoods differ", reference["log_likelihood"], ffi_value)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument("--no-beagle", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated TAXAxPATTERNS, e.g. 12x413,50x1000")
    args = parser.parse_args()
    if not kernels.cpu.available():
        raise SystemExit(f"CPU kernel unavailable: {kernels.cpu.unavailable_reason()}")
    only = {tuple(int(x) for x in item.split("x")) for item in args.only.split(",") if item}
    columns = ["post", "L", "post+pre", "grad", "jax L", "jax grad", "BEAGLE L", "BEAGLE grad"]
    print(f"{'float32' if args.float32 else 'float64'}; median ms per call (best of {args.rounds} rounds); "
          f"jax {jax.__version__}; {jax.devices()[0].device_kind}; threads: "
          f"{os.environ.get('JAXPHYLO_CPU_THREADS', 'all CPUs')}")
    print(f"{'case':>9} {'taxa':>5} {'patt':>5} " + " ".join(f"{c:>10}" for c in columns)
          + f" {'grad/L':>6} {'L/BGL':>6} {'post/BGL':>8}")
    for name, taxa, patterns in CASES:
        if only and (taxa, patterns) not in only:
            continue
        row = run_case(name, taxa, patterns, args)
        if row is None:
            continue
        cells = " ".join(f"{row[c]:>10.4g}" if row.get(c) is not None else f"{'-':>10}" for c in columns)
        beagle = row.get("BEAGLE L")
        ratios = (f"{row['L'] / beagle:>6.2f} {row['post'] / beagle:>8.2f}" if beagle else f"{'-':>6} {'-':>8}")
        print(f"{row['case']:>9} {row['taxa']:>5} {row['patterns']:>5} {cells} {row['grad'] / row['L']:>6.2f} "
              f"{ratios}", flush=True)


if __name__ == "__main__":
    main()
