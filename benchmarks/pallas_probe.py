"""The Pallas passes against the XLA passes on one device: log-likelihood and its gradient, f64.

    python benchmarks/pallas_probe.py [--quick] [--cases 0,4] [--configs 128x4,128x4w,e2048x4]

Each row: one case, one (pattern tile, warps) setting of the Pallas kernels (`eNxW`: blocks of N
elements, the amino-acid and codon kernels); times are medians of 30
calls to `block_until_ready` of the jitted function of the branch lengths (transition matrices, the
passes, the root sum; the gradient adds the pre-order pass), compile time apart. Both kernels run in
the same process on the same inputs; `diff` is the relative difference of their values.
Writes benchmarks/results/pallas_probe-<backend>.json (or $OUT/...).
"""
import argparse, json, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(__file__))
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import likelihood as bench
from jaxphylo.tree import branch_index
from jaxphylo.likelihood import kernels
from jaxphylo.likelihood import kernel_arrays, layout_lengths, schedule_for

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true")
ap.add_argument("--cases", help="indices into the case list, e.g. 4 or 0,3")
ap.add_argument("--configs", default="128x4,256x4", help="TILExWARPS[w] settings; a trailing w walks every node "
                "in one launch per pass (the small-tree kernels), else one launch per step; eELEMENTSxWARPS sets "
                "the blocks' size (20 and 61 states)")
args = ap.parse_args()


def med(f, *a, n=30):
    t = time.perf_counter(); jax.block_until_ready(f(*a)); first = time.perf_counter() - t
    ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts), first


def functions(model, index):
    """Fresh jitted (log L, value-and-gradient) of the branch lengths: traced under the current kernel.
    Data and schedule are arguments (closed over, XLA would constant-fold them)."""
    def total(lengths, data, sched):
        P, pi, w, codes, table = kernel_arrays(model, layout_lengths(lengths, index, sched), data, jnp.float64)
        return jnp.sum(data.weights * kernels.pattern_log_likelihoods(P, pi, w, codes, table, sched))
    return jax.jit(total), jax.jit(jax.value_and_grad(total))


out = os.path.join(os.environ.get("OUT", "benchmarks/results"), f"pallas_probe-{jax.default_backend()}.json")
cases = [("primates_mtDNA", 12, 413), ("4", 50, 1000), ("dengue352_hmc_clock", 352, 2227), ("4", 1000, 1000),
         ("4", 1000, 10000), ("61", 62, 3600), ("20", 100, 2000)]
if args.quick:
    cases = cases[:1]
if args.cases:
    cases = [cases[int(i)] for i in args.cases.split(",")]
rows = []
for case in cases:
    tree, model, data = bench.make_case(*case)
    sched = schedule_for(tree, model, data, jnp.float64)
    index = branch_index(tree.topology)
    a = (tree.branch_lengths, data, sched)
    os.environ[kernels.KERNEL_ENV] = "xla"
    lik, grad = functions(model, index)
    xla = dict(lik_ms=med(lik, *a), grad_ms=med(grad, *a))
    v_ref, g_ref = grad(*a)
    os.environ[kernels.KERNEL_ENV] = "pallas"
    for config in args.configs.split(","):
        walk = config.endswith("w")
        blocks = config.startswith("e")
        tile, warps = map(int, config.strip("we").split("x"))
        if blocks != (case[0] in ("20", "61")):
            continue
        if blocks:
            kernels.pallas.BLOCK_ELEMENTS, kernels.pallas.NUM_WARPS = tile, warps
        else:
            kernels.pallas.PATTERN_TILE, kernels.pallas.NUM_WARPS = tile, warps
        kernels.pallas.WALK_MAX_TIPS = 10**9 if walk else 0
        try:
            lik, grad = functions(model, index)
            got = dict(lik_ms=med(lik, *a), grad_ms=med(grad, *a))
            v, g = grad(*a)
            row = dict(case=case, tile=tile, warps=warps, walk=walk,
                       pallas_lik_ms=got["lik_ms"][0], xla_lik_ms=xla["lik_ms"][0],
                       pallas_grad_ms=got["grad_ms"][0], xla_grad_ms=xla["grad_ms"][0],
                       pallas_compile_s=got["grad_ms"][1], xla_compile_s=xla["grad_ms"][1],
                       value_rel_diff=float(abs(v - v_ref) / abs(v_ref)),
                       grad_rel_diff=float(jnp.max(jnp.abs(g - g_ref)) / jnp.max(jnp.abs(g_ref))))
        except Exception as e:  # a probe: record what failed and go on
            row = dict(case=case, tile=tile, warps=warps, walk=walk, error=str(e)[:400])
        print(row, flush=True)
        rows.append(row)
        json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows), open(out, "w"), indent=1)
