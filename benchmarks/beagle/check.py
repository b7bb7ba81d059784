"""Check the BEAGLE reference harness against jaxphylo, then time it at three sizes.

    python benchmarks/beagle/check.py [--data DIR]

For each case the same transition matrices (from jaxphylo's model) go to BEAGLE;
its log-likelihood must equal `jaxphylo.log_likelihood` to 1e-8, and its
branch-length derivatives (upper partials + beagleCalculateEdgeLogLikelihoods)
must match `jaxphylo.branch_length_derivatives`. Timings are BEAGLE's (CPU SSE,
float64, one thread, 4 categories), median ms per evaluation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxphylo as jp  # noqa: E402
from jaxphylo.likelihood import pattern_data  # noqa: E402

from _beagle import beagle_likelihood, tips_from_table  # noqa: E402

MODEL = "HKY{2}+F{.3,.2,.2,.3}+G4{0.5}"
TOLERANCE = 1e-8


def cases(data: Path):
    model = jp.parse_model(MODEL)
    aln = jp.read_alignment(data / "primates_mtDNA" / "alignment.fasta")
    yield "primates 12x413", aln, jp.bionj(jp.distances(aln, "k2p"), aln.taxa), model

    tree = jp.random_topology_tree([f"t{i}" for i in range(50)], seed=1, mean_branch_length=0.05)
    yield "random 50x1000", jp.simulate(tree, model, 1000, seed=1), tree, model

    folder = data / "dengue352_hmc_clock"
    tree = jp.read_tree(folder / "tree.nwk")
    tree = tree.with_branch_lengths(tree.branch_lengths * 0.004)  # years -> substitutions/site
    yield "dengue 352x2227", jp.read_alignment(folder / "alignment.fasta"), tree, model


def run_case(name, aln, tree, model):
    lengths = tree.branch_lengths
    transition = np.asarray(model.transition_matrices(lengths))
    # each P depends on its own branch only, so one JVP with unit tangents gives every dP/dt
    _, derivative = jax.jvp(model.transition_matrices, (lengths,), (jnp.ones_like(lengths),))
    _, weights = model.rate_categories()
    data = pattern_data(aln, tree)  # tip codes in the tree's tip order, plus one missing row
    tip_states, tip_partials = tips_from_table(np.asarray(data.tip_codes)[:-1], np.asarray(data.tip_table))
    result = beagle_likelihood(transition, np.asarray(model.frequencies), np.asarray(weights), tip_states,
                               np.asarray(data.weights), np.asarray(tree.topology.parent_array),
                               transition_derivative=np.asarray(derivative), tip_partials=tip_partials)
    if result is None:
        return None
    expected = float(jp.log_likelihood(aln, tree, model))
    gradient = np.asarray(jp.branch_length_derivatives(aln, tree, model)[0])
    root = tree.topology.root
    mask = np.arange(len(gradient)) != root
    scale = np.maximum(1.0, np.abs(gradient[mask]))
    return {
        "case": name,
        "jaxphylo": expected,
        "beagle": result["log_likelihood"],
        "diff": abs(result["log_likelihood"] - expected),
        "diff_rescaled": abs(result["log_likelihood_rescaled"] - expected),
        "grad_rel": float(np.max(np.abs(np.asarray(result["derivatives"])[mask] - gradient[mask]) / scale)),
        "grad_rel_rescaled": float(np.max(
            np.abs(np.asarray(result["derivatives_rescaled"])[mask] - gradient[mask]) / scale)),
        "partial_tips": len(tip_partials),
        **{k: result[k] for k in ("median_ms", "median_ms_rescaled", "gradient_median_ms",
                                   "gradient_median_ms_rescaled", "cpu_per_wall", "implementation",
                                   "resource", "version", "flags")},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data")
    args = parser.parse_args()
    rows = []
    for name, aln, tree, model in cases(args.data):
        row = run_case(name, aln, tree, model)
        if row is None:
            print("BEAGLE unavailable: nothing to check")
            return 1
        rows.append(row)
    first = rows[0]
    print(f"BEAGLE {first['version']}: {first['implementation']} on {first['resource']}")
    print(f"flags: {' | '.join(first['flags'])}")
    print(f"model {MODEL}; median ms per evaluation, one thread (cpu/wall {first['cpu_per_wall']:.2f})\n")
    header = (f"{'case':<17} {'log L (jaxphylo)':>18} {'|dlogL|':>8} {'|dlogL| sc':>10} {'grad rel':>8} "
              f"{'lik ms':>8} {'lik ms sc':>9} {'grad ms':>8} {'grad ms sc':>10}")
    print(header)
    print("-" * len(header))
    ok = True
    for r in rows:
        ok &= r["diff"] <= TOLERANCE and r["diff_rescaled"] <= TOLERANCE
        ok &= r["grad_rel"] <= 1e-6 and r["grad_rel_rescaled"] <= 1e-6
        print(f"{r['case']:<17} {r['jaxphylo']:>18.8f} {r['diff']:>8.1e} {r['diff_rescaled']:>10.1e} "
              f"{max(r['grad_rel'], r['grad_rel_rescaled']):>8.1e} {r['median_ms']:>8.3f} "
              f"{r['median_ms_rescaled']:>9.3f} {r['gradient_median_ms']:>8.3f} "
              f"{r['gradient_median_ms_rescaled']:>10.3f}")
    print("\nsc = with per-node rescaling; grad = post-order + upper partials + d logL/dt on every edge")
    print("validation:", "PASS" if ok else "FAIL", f"(log L to {TOLERANCE:g}, gradient to 1e-6 relative)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
