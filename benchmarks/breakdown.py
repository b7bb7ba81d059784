"""Where the time of one log-likelihood goes: rate categories, transition matrices, peeling.

    python benchmarks/breakdown.py [--taxa N] [--patterns P]

Times each piece as its own jitted function (median of 30 after a warm-up), and
the peeling twice: step counts as data (while loops, one compilation per taxon
count) and as static Python counts (scans, one compilation per level profile).
"""

import argparse
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp

import jaxphylo as jp
from jaxphylo.likelihood import _peeling
from jaxphylo.likelihood._api import kernel_branch_lengths
from likelihood import make_case


def median_ms(fn, *args, repeats=30):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--taxa", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--patterns", type=int, default=1000)
    args = parser.parse_args()
    print(f"device {jax.devices()[0].device_kind}")
    for taxa in args.taxa:
        tree, model, data = make_case("4", taxa, args.patterns)
        schedule = jp.build_schedule(tree.topology)
        static = tuple(int(s) for s in schedule.steps)
        times = kernel_branch_lengths(tree.branch_lengths, schedule)
        categories = eqx.filter_jit(lambda m: m.rate_categories())
        matrices = eqx.filter_jit(lambda m, t: m.transition_matrices(t))
        transition = matrices(model, times)
        pi, (_, w) = model.frequencies, model.rate_categories()
        dynamic = eqx.filter_jit(lambda p, s: _peeling.pattern_log_likelihoods(p, pi, w, data.tip_codes, data.tip_table, s))
        fixed = eqx.filter_jit(lambda p, s: _peeling.pattern_log_likelihoods(p, pi, w, data.tip_codes, data.tip_table, s, static))
        row = {
            "categories": median_ms(categories, model),
            "transition": median_ms(matrices, model, times),
            "peel_while": median_ms(dynamic, transition, schedule),
            "peel_static": median_ms(fixed, transition, schedule),
            "steps": sum(static),
        }
        print(taxa, args.patterns, " ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
