"""Where one small CPU likelihood call goes (primates 12 x 413, HKY+G4): eqx.filter_jit dispatch against plain
jax.jit, the transition matrices, the Gamma rates, a trivial op; medians of 200 calls, ms.

    cd benchmarks && python cpu_call_breakdown.py
"""
import time, statistics, sys
sys.path.insert(0, ".")
import jax, jax.numpy as jnp, equinox as eqx
import likelihood as bench
from jaxphylo.tree import branch_index
from jaxphylo.likelihood import schedule_for
tree, model, data = bench.make_case("primates_mtDNA", 12, 413)
dtype = jnp.float64
schedule = schedule_for(tree, model, data, dtype)
idx = branch_index(tree.topology)
args = (model, tree.branch_lengths, data, schedule, idx, dtype, None)
def med(f, n=200):
    f(); ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f()); ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)
print("filter_jit total:", med(lambda: bench.total_log_likelihood(*args)))
params, static = eqx.partition((model, tree.branch_lengths, data, schedule, idx), eqx.is_array)
@jax.jit
def plain(params):
    m, b, d, s, i = eqx.combine(params, static)
    return bench.total_log_likelihood.__wrapped__(m, b, d, s, i, dtype, None) if hasattr(bench.total_log_likelihood, "__wrapped__") else None
try:
    print("plain jit:", med(lambda: plain(params)))
except Exception as e:
    print("plain failed", e)
tiny = jax.jit(lambda x: x + 1); x = jnp.ones(3)
print("tiny jit:", med(lambda: tiny(x)))
from jaxphylo.likelihood import kernel_arrays, layout_lengths
arrays = jax.jit(lambda m, b, s: kernel_arrays(m, layout_lengths(b, idx, s), data, dtype))
print("P matrices etc:", med(lambda: arrays(model, tree.branch_lengths, schedule)))
rates = jax.jit(lambda m: m.rate_categories()[0])
print("gamma rates:", med(lambda: rates(model)))
