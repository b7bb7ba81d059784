"""NUTS efficiency: minimum ESS per second over branch lengths, and the ratio transform's share.

    python benchmarks/nuts.py [--data DIR] [--chains 4 16 64] [--sweep 1 4 16 64 256] [--mrbayes-ngen N]

1. Unrooted HKY+G4 on a real alignment (default primates_mtDNA, BIONJ topology), MrBayes's
   priors, for each `--chains` count. NUTS runs warmup, then two equal sampling blocks; the first block pays for
   compilation, the second is timed, and its minimum bulk ESS over branch lengths per second
   is reported (steady), beside the minimum ESS of both blocks over the whole wall time since the start (end to
   end: preparing, compiling, warm-up and sampling). With `--mrbayes-ngen`, MrBayes (CPU, 2 runs x 1 chain) runs
   on the same data and priors; its ESS per second counts the post-burn-in 75% of its wall time, and its branch
   lengths are matched to ours by the split they cut.
2. With `--sweep`: one value and gradient of B chains at once (`vmap`, each chain at its own point) on each
   `--sweep-data` set, the measurement behind `jaxphylo.inference.nuts.default_chains` on a GPU.
3. A dated time tree (default dengue352_hmc_clock: 352 taxa), strict clock, constant coalescent:
   the time of the gradient of the potential energy (one leapfrog step's work) against the
   time of the ratio transform with its log-Jacobian and their gradient alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS, init_to_value
from numpyro.infer.util import initialize_model, potential_energy

import jaxphylo as jp
from jaxphylo.inference import Analysis, RatioTransform, prepare

from _common import device_record, save, time_call

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))


def nuts_efficiency(alignment, tree, chains: int, warmup: int, samples: int) -> dict:
    """`chains` chains of `warmup` + 2 x `samples` iterations: the second sampling block's minimum ESS per second
    (steady state), and end to end the minimum ESS of both blocks' draws over all the wall time since the start,
    warm-up and compilation included (what a user waits for)."""
    began = time.perf_counter()
    prepared = prepare(alignment, tree, Analysis("HKY+G4", priors="mrbayes"))
    method = "vectorized" if jax.default_backend() != "cpu" else "sequential"
    mcmc = MCMC(NUTS(prepared.model, init_strategy=init_to_value(values=prepared.init)), num_warmup=warmup,
                num_samples=samples, num_chains=chains, chain_method=method, progress_bar=False)
    start = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(0), prepared.data, collect_warmup=False)
    warmup_seconds = time.perf_counter() - start
    blocks, draws = [], []
    for _ in range(2):
        start = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, prepared.data, extra_fields=("num_steps",))
        jax.block_until_ready(mcmc.last_state)
        blocks.append(time.perf_counter() - start)
        mcmc.post_warmup_state = mcmc.last_state
        draws.append(np.asarray(mcmc.get_samples(group_by_chain=True)["branch_lengths"]))
    end_to_end = time.perf_counter() - began
    whole = effective_sample_size(np.concatenate(draws, axis=1))
    lengths = draws[1]
    ess = effective_sample_size(lengths)
    steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
    return {"chains": chains, "warmup": warmup, "samples": samples, "chain_method": method,
            "warmup_seconds_with_compile": warmup_seconds, "first_block_seconds": blocks[0],
            "timed_block_seconds": blocks[1], "min_ess": float(ess.min()), "median_ess": float(np.median(ess)),
            "min_ess_per_second": float(ess.min() / blocks[1]), "mean_leapfrog_steps": float(steps.mean()),
            "end_to_end_seconds": end_to_end, "end_to_end_min_ess": float(whole.min()),
            "end_to_end_min_ess_per_second": float(whole.min() / end_to_end),
            "seconds_per_gradient": blocks[1] / float(steps.sum() / chains if method == "vectorized" else steps.sum())}


def start_and_potential(prepared):
    """The start in NumPyro's unconstrained coordinates and `potential(z, data)`, the potential energy with the
    data an argument (closed over, XLA would constant-fold gathers of them)."""
    info = initialize_model(jax.random.PRNGKey(0), prepared.model, model_args=(prepared.data,),
                            init_strategy=init_to_value(values=prepared.init))
    return info.param_info.z, lambda z, data: potential_energy(prepared.model, (data,), {}, z)


def gradient_sweep(alignment, tree, chains: list[int], repeats: int) -> list[dict]:
    """Milliseconds per value and gradient of the potential energy for `B` chains at once (`vmap`, as vectorized
    NUTS chains take them), each chain at its own point: where the device's width runs out, the time starts to
    grow with `B`. `cells` is one chain's work: patterns x rate categories x states x nodes."""
    prepared = prepare(alignment, tree, Analysis("HKY+G4", priors="mrbayes"))
    z, potential = start_and_potential(prepared)
    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(potential), in_axes=(0, None)))
    patterns = int(prepared.data.tip_codes.shape[1])
    cells = patterns * 4 * 4 * (2 * len(alignment.taxa) - 2)
    rows = []
    for b in chains:
        jitter = np.random.default_rng(b).uniform(-0.05, 0.05, b)
        zb = jax.tree.map(lambda x: jnp.asarray(x)[None] + jitter.reshape((b,) + (1,) * jnp.ndim(x)), z)
        first, median = time_call(lambda: value_and_grad(zb, prepared.data), repeats)
        rows.append({"data": None, "taxa": len(alignment.taxa), "patterns": patterns, "cells": cells, "chains": b,
                     "ms": 1e3 * median, "ms_per_chain": 1e3 * median / b, "compile_s": first - median})
    return rows


def _splits(dtree, taxa):
    """Branch length per split (the side without `taxa[0]`) of a DendroPy tree."""
    out = {}
    for node in dtree.postorder_node_iter():
        if node.parent_node is None:
            continue
        side = frozenset(leaf.taxon.label for leaf in node.leaf_iter())
        out[side if taxa[0] not in side else frozenset(taxa) - side] = node.edge.length or 0.0
    return out


def mrbayes_efficiency(alignment, tree, ngen: int, work: Path) -> dict:
    import dendropy

    import mrbayes_comparison

    draws, seconds = mrbayes_comparison.run_mrbayes(alignment, tree, work, ngen)
    taxa = list(alignment.taxa)
    per_run = []
    for k in (1, 2):
        trees = dendropy.TreeList.get(path=str(work / f"mb.run{k}.t"), schema="nexus", preserve_underscores=True)
        trees = trees[len(trees) // 4:]
        splits = [_splits(t, taxa) for t in trees]
        keys = sorted(splits[0], key=sorted)
        per_run.append(np.array([[s[key] for key in keys] for s in splits]))
    length = min(len(r) for r in per_run)
    ess = effective_sample_size(np.stack([r[:length] for r in per_run]))
    return {"ngen": ngen, "seconds": seconds, "min_ess": float(ess.min()), "median_ess": float(np.median(ess)),
            "min_ess_per_second": float(ess.min() / (0.75 * seconds)),
            "tree_length_mean": float(draws["tree_length"].mean())}


def transform_share(alignment, tree, tip_heights, repeats: int) -> dict:
    """Gradient of the whole potential energy against the ratio transform + log-Jacobian alone."""
    prepared = prepare(alignment, tree, Analysis("HKY+G4", clock="strict"), tip_heights)
    z, potential = start_and_potential(prepared)
    full = jax.jit(jax.value_and_grad(potential))
    transform = RatioTransform(prepared.time)

    def heights_part(x):
        heights = transform(x)
        return jnp.sum(heights) + transform.log_abs_det_jacobian(x, heights)

    part = jax.jit(jax.value_and_grad(heights_part))
    x = z["node_heights"]
    full_first, full_median = time_call(lambda: full(z, prepared.data), repeats)
    part_first, part_median = time_call(lambda: part(x), repeats)
    return {"taxa": prepared.time.num_tips, "patterns": int(prepared.data.tip_codes.shape[1]),
            "depth": prepared.time.max_depth, "rounds": int(prepared.time.ancestors.shape[0]),
            "gradient_ms": 1e3 * full_median, "transform_gradient_ms": 1e3 * part_median,
            "share": part_median / full_median, "gradient_compile_s": full_first - full_median,
            "transform_compile_s": part_first - part_median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(SHARED / "primates_mtDNA"))
    parser.add_argument("--time-data", default=str(SHARED / "dengue352_hmc_clock"))
    parser.add_argument("--chains", type=int, nargs="+", default=[4], help="a NUTS run for each count")
    parser.add_argument("--sweep", type=int, nargs="*", default=None, metavar="CHAINS",
                        help="also time one value + gradient of this many chains at once on each --sweep-data set")
    parser.add_argument("--sweep-data", nargs="+", default=["primates_mtDNA", "DS1", "carnivores"],
                        help="data sets (folders of --data's parent) for --sweep")
    parser.add_argument("--no-transform", action="store_true", help="leave out the ratio transform's share")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--mrbayes-ngen", type=int, default=0, help="also run MrBayes (CPU) for this many generations")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    record = device_record("nuts")
    alignment = jp.read_alignment(Path(args.data) / "alignment.fasta")
    tree = jp.bionj(jp.distances(alignment, "k2p", saturated=5.0), alignment.taxa)
    record["nuts"] = []
    for chains in args.chains:
        nuts = nuts_efficiency(alignment, tree, chains, args.warmup, args.samples)
        nuts["data"] = Path(args.data).name
        record["nuts"].append(nuts)
        print(f"NUTS {nuts['data']}: {chains} chains ({nuts['chain_method']}), {args.samples} draws each in "
              f"{nuts['timed_block_seconds']:.2f} s; min ESS {nuts['min_ess']:.0f} -> "
              f"{nuts['min_ess_per_second']:.1f} ESS/s; {nuts['mean_leapfrog_steps']:.1f} leapfrog steps/draw, "
              f"{1e3 * nuts['seconds_per_gradient']:.2f} ms per gradient step; end to end "
              f"{nuts['end_to_end_seconds']:.1f} s, {nuts['end_to_end_min_ess_per_second']:.1f} ESS/s", flush=True)
    if args.sweep:
        record["sweep"] = []
        for name in args.sweep_data:
            folder = Path(args.data).parent / name
            if not folder.is_dir():
                continue
            data = jp.read_alignment(folder / "alignment.fasta")
            start = jp.bionj(jp.distances(data, "k2p", saturated=5.0), data.taxa)
            for row in gradient_sweep(data, start, args.sweep, args.repeats):
                row["data"] = name
                record["sweep"].append(row)
                print(f"{name}: {row['chains']} chains at once, {row['ms']:.3f} ms per value + gradient "
                      f"({row['ms_per_chain']:.4f} per chain), cells {row['cells']}", flush=True)
    if args.mrbayes_ngen:
        mb = mrbayes_efficiency(alignment, tree, args.mrbayes_ngen, Path("mrbayes-bench"))
        record["mrbayes"] = mb
        print(f"MrBayes: {mb['ngen']} generations x 2 runs in {mb['seconds']:.1f} s; min ESS {mb['min_ess']:.0f} -> "
              f"{mb['min_ess_per_second']:.1f} ESS/s")
    folder = Path(args.time_data)
    if folder.is_dir() and not args.no_transform:
        dated = jp.read_alignment(folder / "alignment.fasta")
        time_tree_file = jp.read_tree(folder / "tree.nwk")
        heights = jp.io.tip_heights(jp.io.read_dates(folder / "dates.tsv"), time_tree_file.taxa, "dates.tsv")
        share = transform_share(dated, time_tree_file, heights, args.repeats)
        share["data"] = folder.name
        record["transform"] = share
        print(f"time tree {share['data']} ({share['taxa']} taxa, {share['patterns']} patterns, depth {share['depth']}): "
              f"gradient {share['gradient_ms']:.2f} ms, ratio transform + Jacobian {share['transform_gradient_ms']:.3f} ms "
              f"= {100 * share['share']:.1f}% of it")
    save(record, args.out, "nuts")


if __name__ == "__main__":
    main()
