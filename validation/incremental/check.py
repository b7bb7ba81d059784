"""Kept partials against the full recomputation over thousands of proposals on real data, move by move (issue #39).

    python validation/incremental/check.py [--steps 300] [--dated-generations 3000]

1. MC³'s tree moves (NNI, SPR, extending SPR and TBR, branch multiplier, tree-length multiplier, node slider), one
   move at a time: 4 chains propose `--steps` times each (tuning 0.5, random trees to start), every proposal's
   log-likelihood by `proposed_partials` (the dirty nodes only) and by `batch_pattern_log_likelihoods` (every
   node), accepted with probability 1/2 so that the kept rows of accepted and rejected chains are both exercised.
   DS1 under JC69 and carnivores under HKY+G4, on the kernel this machine uses (`kernels.update_backend`).
2. The dated sampler's moves (narrow and wide exchange, subtree slide, Wilson-Balding, node and root height, HMC):
   rsv2 (HKY+G4, strict clock, constant coalescent), the same seed with kept partials and with every node
   recomputed: both must visit the same trees with the same acceptances, their sampled log L equal to 1e-9.

Tolerance: 1e-10 relative per proposal for MC³ (the two sum the same node terms' log scale factors in different
orders: rounding only), 1e-9 for the dated runs' log L (its accept decisions compound rounding over thousands of
generations, as `tests/test_dated_topology.py` states). Writes `results-<platform>.json` beside this file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "validation" / "dated")]

import jaxphylo as jp  # noqa: E402
from jaxphylo.inference.dated import DatedSettings, dated_mcmc  # noqa: E402
from jaxphylo.inference.moves import BRANCH_MOVES, TOPOLOGY_MOVES, propose_tree  # noqa: E402
from jaxphylo.likelihood import (  # noqa: E402
    accept_partials, batch_pattern_log_likelihoods, full_partials, kernels, max_step_width, pattern_data,
    proposed_partials,
)
from jaxphylo.tree import from_view, kernel_batch, phase_widths, to_view  # noqa: E402

DATA = next((p for p in (ROOT.parent / "shared" / "data", ROOT / ".devdata" / "data") if p.exists()), None)
CHAINS = 4
TREE_MOVES = TOPOLOGY_MOVES + BRANCH_MOVES


def mc3_case(name: str, model_string: str, steps: int, seed: int) -> dict:
    """Every MC³ tree move alone for `steps` generations of `CHAINS` chains: the largest relative difference
    between the kept-partials and the full log-likelihood of a proposal, and how many were accepted."""
    alignment, model = jp.read_alignment(DATA / name / "alignment.fasta"), jp.parse_model(model_string)
    batch = kernel_batch([jp.random_topology_tree(alignment.taxa, seed=seed + c) for c in range(CHAINS)])
    data, dtype = pattern_data(alignment, batch), jnp.float64
    widths = phase_widths(len(alignment.taxa), max_step_width(model, data, dtype, CHAINS))
    num_tips, weights = len(alignment.taxa), jnp.asarray(data.weights)

    @jax.jit
    def step(state, parents, lengths, key, kind):
        k_move, k_accept = jax.random.split(key)
        up, edge = jax.vmap(to_view)(parents, lengths)
        up, edge, _ = jax.vmap(propose_tree, in_axes=(None, 0, 0, 0, None, None))(
            kind, jax.random.split(k_move, CHAINS), up, edge, num_tips, jnp.full(3, 0.5))
        new_parents, new_lengths = jax.vmap(from_view)(up.astype(parents.dtype), edge,
                                                       jnp.argmin(parents, axis=1).astype(parents.dtype))
        proposal, per_pattern = proposed_partials(state, model, new_parents, new_lengths, parents, lengths, data,
                                                  dtype)
        full = batch_pattern_log_likelihoods(model, new_parents, new_lengths, data, widths, dtype) @ weights
        ours = per_pattern @ weights
        accept = jax.random.bernoulli(k_accept, 0.5, (CHAINS,))
        pick = lambda new, old: jnp.where(accept[:, None], new, old)  # noqa: E731
        return (accept_partials(state, proposal, accept), pick(new_parents, parents), pick(new_lengths, lengths),
                jnp.max(jnp.abs(ours - full) / jnp.abs(full)), jnp.sum(accept), jnp.sum(proposal.computed))

    rows = {}
    for kind, move in enumerate(TREE_MOVES):
        parents, lengths = batch.parents, batch.branch_lengths
        state, _ = full_partials(model, parents, lengths, data, dtype)
        key, worst, accepted, computed = jax.random.PRNGKey(seed + kind), 0.0, 0, 0
        began = time.perf_counter()
        for _ in range(steps):
            key, k = jax.random.split(key)
            state, parents, lengths, difference, taken, nodes = step(state, parents, lengths, k, jnp.int32(kind))
            worst, accepted, computed = max(worst, float(difference)), accepted + int(taken), computed + int(nodes)
        rows[move] = {"proposals": steps * CHAINS, "accepted": accepted,
                      "max_relative_difference": worst, "passed": worst <= 1e-10,
                      "nodes_per_proposal": computed / (steps * CHAINS), "nodes_per_full_pass": num_tips - 1,
                      "seconds": time.perf_counter() - began}
        print(name, move, rows[move], flush=True)
    return {"data": name, "model": model_string, "taxa": num_tips, "patterns": int(data.tip_codes.shape[1]),
            "chains": CHAINS, "moves": rows}


def dated_case(generations: int, seed: int) -> dict:
    """rsv2 under the dated sampler, kept partials against every node recomputed, from one seed."""
    from run_jaxphylo import read_dataset

    alignment, dates = read_dataset(DATA / "rsv2")
    runs = []
    for incremental in (True, False):
        settings = DatedSettings(chains=CHAINS, generations=generations, sample_every=20, block=25,
                                 tune=generations // 10, incremental=incremental)
        began = time.perf_counter()
        result = dated_mcmc(alignment, "HKY+G4", dates, clock="strict", settings=settings, seed=seed)
        runs.append((result, time.perf_counter() - began))
    (mine, mine_s), (reference, reference_s) = runs
    same_trees = all(np.array_equal(x, y) for a, b in zip(mine.samples.kept_trees(0.0),
                                                          reference.samples.kept_trees(0.0), strict=True)
                     for x, y in zip(a, b, strict=True))
    ours, full = mine.samples.column("likelihood", 0.0), reference.samples.column("likelihood", 0.0)
    worst = float(np.max(np.abs(ours - full) / np.abs(full)))
    record = {"data": "rsv2", "model": "HKY+G4", "clock": "strict", "tree_prior": "constant coalescent",
              "chains": CHAINS, "generations": generations, "acceptance_kept": mine.acceptance,
              "acceptance_full": reference.acceptance, "same_acceptance": mine.acceptance == reference.acceptance,
              "same_trees": same_trees, "max_relative_difference_sampled_log_likelihood": worst,
              "seconds_kept": mine_s, "seconds_full": reference_s}
    record["passed"] = record["same_acceptance"] and same_trees and worst <= 1e-9
    print(record, flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="generations per MC³ move (x 4 chains)")
    parser.add_argument("--dated-generations", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    record = {"platform": jax.default_backend(), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "update_backend": kernels.update_backend(4),
              "mc3": [mc3_case("DS1", "JC", args.steps, args.seed), mc3_case("carnivores", "HKY+G4", args.steps,
                                                                                  args.seed)],
              "dated": dated_case(args.dated_generations, args.seed)}
    record["passed"] = all(row["passed"] for case in record["mc3"] for row in case["moves"].values()) and \
        record["dated"]["passed"]
    out = Path(__file__).with_name(f"results-{record['platform']}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}: {'passed' if record['passed'] else 'FAILED'}")


if __name__ == "__main__":
    main()
