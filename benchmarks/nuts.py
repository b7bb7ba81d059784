"""NUTS efficiency: minimum ESS per second over branch lengths, and the ratio transform's share.

    python benchmarks/nuts.py [--data DIR] [--time-data DIR] [--mrbayes-ngen N]

1. Unrooted HKY+G4 on a real alignment (default primates_mtDNA, BIONJ topology), MrBayes's
   priors. NUTS runs warmup, then two equal sampling blocks; the first block pays for
   compilation, the second is timed, and its minimum bulk ESS over branch lengths per second
   is reported. With `--mrbayes-ngen`, MrBayes (CPU, 2 runs x 1 chain) runs on the same data
   and priors; its ESS per second counts the post-burn-in 75% of its wall time, and its branch
   lengths are matched to ours by the split they cut.
2. A dated time tree (default dengue352_hmc_clock: 352 taxa), strict clock, constant coalescent:
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
    prepared = prepare(alignment, tree, Analysis("HKY+G4", priors="mrbayes"))
    method = "vectorized" if jax.default_backend() != "cpu" else "sequential"
    mcmc = MCMC(NUTS(prepared.model, init_strategy=init_to_value(values=prepared.init)), num_warmup=warmup,
                num_samples=samples, num_chains=chains, chain_method=method, progress_bar=False)
    start = time.perf_counter()
    mcmc.warmup(jax.random.PRNGKey(0), prepared.data, collect_warmup=False)
    warmup_seconds = time.perf_counter() - start
    blocks = []
    for _ in range(2):
        start = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key, prepared.data, extra_fields=("num_steps",))
        jax.block_until_ready(mcmc.last_state)
        blocks.append(time.perf_counter() - start)
        mcmc.post_warmup_state = mcmc.last_state
    lengths = np.asarray(mcmc.get_samples(group_by_chain=True)["branch_lengths"])
    ess = effective_sample_size(lengths)
    steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
    return {"chains": chains, "warmup": warmup, "samples": samples, "chain_method": method,
            "warmup_seconds_with_compile": warmup_seconds, "first_block_seconds": blocks[0],
            "timed_block_seconds": blocks[1], "min_ess": float(ess.min()), "median_ess": float(np.median(ess)),
            "min_ess_per_second": float(ess.min() / blocks[1]), "mean_leapfrog_steps": float(steps.mean()),
            "seconds_per_gradient": blocks[1] / float(steps.sum() / chains if method == "vectorized" else steps.sum())}


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
    info = initialize_model(jax.random.PRNGKey(0), prepared.model, model_args=(prepared.data,),
                            init_strategy=init_to_value(values=prepared.init))
    z = info.param_info.z
    # the data are an argument: closed over, XLA would constant-fold gathers of them
    full = jax.jit(jax.value_and_grad(lambda p, data: potential_energy(prepared.model, (data,), {}, p)))
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
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--mrbayes-ngen", type=int, default=0, help="also run MrBayes (CPU) for this many generations")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    record = device_record("nuts")
    alignment = jp.read_alignment(Path(args.data) / "alignment.fasta")
    tree = jp.bionj(jp.distances(alignment, "k2p", saturated=5.0), alignment.taxa)
    nuts = nuts_efficiency(alignment, tree, args.chains, args.warmup, args.samples)
    nuts["data"] = Path(args.data).name
    record["nuts"] = nuts
    print(f"NUTS {nuts['data']}: {args.chains} chains ({nuts['chain_method']}), {args.samples} draws each in "
          f"{nuts['timed_block_seconds']:.2f} s; min ESS {nuts['min_ess']:.0f} -> "
          f"{nuts['min_ess_per_second']:.1f} ESS/s; {nuts['mean_leapfrog_steps']:.1f} leapfrog steps/draw, "
          f"{1e3 * nuts['seconds_per_gradient']:.2f} ms per gradient step")
    if args.mrbayes_ngen:
        mb = mrbayes_efficiency(alignment, tree, args.mrbayes_ngen, Path("mrbayes-bench"))
        record["mrbayes"] = mb
        print(f"MrBayes: {mb['ngen']} generations x 2 runs in {mb['seconds']:.1f} s; min ESS {mb['min_ess']:.0f} -> "
              f"{mb['min_ess_per_second']:.1f} ESS/s")
    folder = Path(args.time_data)
    if folder.is_dir():
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
