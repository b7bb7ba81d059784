"""Timings of the public API, to compare two checkouts on one machine (a refactor must not slow them).

    PYTHONPATH=<checkout> python benchmarks/api_timings.py > timings.json

Median of 200 calls of the jitted likelihood and value+gradient (HKY+G4 on BIONJ trees of primates_mtDNA,
12 x 413, and DS1, 27 x 934), MC3 on DS1 (JC, 2 runs x 4 chains, 3,000 generations; the second call has
nothing left to compile), and an ML search on a simulated 12-taxon set (the second call is warm). Not a
comparison with a reference program: `likelihood.py`, `gradient.py`, `mc3.py` and `ml_search.py` are.
"""
import json
import os
import time
from pathlib import Path

import numpy as np
import jax, jax.numpy as jnp
import jaxphylo as jp
from jaxphylo import ml

DATA = Path(os.environ.get("JAXPHYLO_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
out = {}
def median_call(f, *args, n=200):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*args)); times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3
for name in ("primates_mtDNA", "DS1"):
    aln = jp.read_alignment(f"{DATA}/{name}/alignment.fasta")
    tree = jp.bionj(jp.distances(aln), aln.taxa)
    model = jp.parse_model("HKY{4}+F+G4{0.5}", alignment=aln)
    data = jp.likelihood.pattern_data(aln, tree)
    f = jax.jit(lambda b: jp.likelihood.data_log_likelihood(data, tree.with_branch_lengths(b), model))
    g = jax.jit(jax.value_and_grad(lambda b: jp.likelihood.data_log_likelihood(data, tree.with_branch_lengths(b), model)))
    b = jnp.asarray(tree.branch_lengths)
    out[f"{name} likelihood ms"] = median_call(f, b)
    out[f"{name} value+grad ms"] = median_call(g, b)
aln = jp.read_alignment(f"{DATA}/DS1/alignment.fasta")
for k in range(2):
    t = time.perf_counter()
    r = jp.inference.mc3(aln, "JC", runs=2, chains=4, generations=3000, sample_every=100, seed=k)
    out[f"mc3 DS1 3000 gen s (call {k + 1})"] = time.perf_counter() - t
out["mc3 DS1 generations/s (second call)"] = 3000 / out["mc3 DS1 3000 gen s (call 2)"]
sim = jp.simulate(jp.random_topology_tree([f"t{i}" for i in range(12)], seed=1), jp.parse_model("HKY{3}+F{0.3,0.2,0.2,0.3}+G4{0.5}"), 800, seed=2)
for k in range(2):
    t = time.perf_counter()
    res = ml.search(sim, "HKY+G4", seed=1, settings=ml.SearchSettings(patience=2, starts=1))
    out[f"ml search 12 taxa s (call {k + 1})"] = time.perf_counter() - t
out["ml log L"] = res.log_likelihood
print(json.dumps(out, indent=1))
