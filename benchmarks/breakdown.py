"""Where one likelihood call's time goes: the post-order pass with step counts as data or static
(the static one on the trimmed schedule `data_log_likelihood` uses), the transition matrices (with the
Gamma rates), the Gamma rates, a trivial op.

    python benchmarks/breakdown.py [STATES:TAXA:PATTERNS ...]     e.g. 61:62:3600 (default: three nucleotide cases)

The JAX kernels only (on a CPU the public functions use the C++ kernels instead).
"""
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jaxphylo.tree import branch_index, trim_slots
from jaxphylo.likelihood import kernels
from jaxphylo.likelihood import kernel_arrays, layout_lengths, schedule_for
from likelihood import make_case

def med(f, *a, n=30):
    jax.block_until_ready(f(*a)); ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)

cases = [("primates_mtDNA", 12, 413), ("4", 100, 1000), ("4", 1000, 1000)]
if sys.argv[1:]:
    cases = [(a.split(":")[0], *map(int, a.split(":")[1:])) for a in sys.argv[1:]]
for case in cases:
    tree, model, data = make_case(*case)
    sched = schedule_for(tree, model, data, jnp.float64)
    index = branch_index(tree.topology)
    steps = kernels.xla.exact_steps(sched)
    trimmed = trim_slots(sched)
    to_arrays = jax.jit(lambda m, b, s: kernel_arrays(m, layout_lengths(b, index, s), data, jnp.float64))
    P, pi, w, codes, table = to_arrays(model, tree.branch_lengths, sched)
    P_trimmed = to_arrays(model, tree.branch_lengths, trimmed)[0]
    def run(P, pi, w, codes, table, sched, static):
        parts, ls = kernels.xla.post_order_partials(P, codes, table, sched, static)
        return kernels.xla.log_likelihoods_from(parts, ls, pi, w, sched)
    dyn = jax.jit(lambda *a: run(*a, None))
    sta = jax.jit(lambda *a: run(*a, steps))
    model_only = jax.jit(lambda m, b: kernel_arrays(m, layout_lengths(b, index, sched), data, jnp.float64)[0])
    rates_only = jax.jit(lambda m: m.rate_categories()[0])
    tiny = jax.jit(lambda x: x + 1)
    print(case, "steps", steps, "| post-order: counts as data %.3f, static %.3f | P matrices %.3f gamma %.3f "
          "tiny op %.3f ms" % (med(dyn, P, pi, w, codes, table, sched),
                               med(sta, P_trimmed, pi, w, codes, table, trimmed),
        med(model_only, model, tree.branch_lengths), med(rates_only, model), med(tiny, jnp.ones(3))), flush=True)
