"""Batches of trees: value and gradient of B trees in one call against one tree, and small-tree latency.

    python benchmarks/batch.py [--out DIR]

Each row times `jax.value_and_grad` (branch lengths of every tree and the model)
of the summed log-likelihoods of a `TreeBatch` of B random topologies over the
same 50 taxa x 1,000 patterns (HKY+G4), the schedule built on the device inside
the call; `per tree` divides by B. The issue's targets: a batch of 64 in at most
3x the time of one, and 12 x 413 value-and-gradient at most 0.25 ms on an H100.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

import jaxphylo as jp
from jaxphylo.likelihood import batch_data_log_likelihoods

from _common import device_record, save, time_call
from likelihood import make_case

BATCHES = (1, 4, 16, 64, 256)


def value_and_gradient(trees, data, model):
    def total(lengths, model):
        batch = eqx.tree_at(lambda t: t.branch_lengths, trees, lengths)
        return jnp.sum(batch_data_log_likelihoods(data, batch, model))
    return jax.jit(jax.value_and_grad(total, argnums=(0, 1)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}")
    print(f"{'taxa':>5} {'patt':>6} {'batch':>6} | {'ms':>9} {'per tree ms':>11} {'vs one':>7} | {'compile s':>9}")
    rows, single = [], None
    cases = [("primates_mtDNA", 12, 413, (1, 64))] + [("4", 50, 1000, BATCHES)]
    for name, taxa, patterns, batches in cases:
        tree, model, data = make_case(name, taxa, patterns)
        for size in batches:
            trees = jp.TreeBatch.from_trees([jp.random_topology_tree(tree.taxa, seed=s, mean_branch_length=0.05)
                                             for s in range(size)])
            function = value_and_gradient(trees, data, model)
            first, median = time_call(lambda: function(trees.branch_lengths, model), args.repeats)
            single = median if size == 1 else single
            row = {"case": name, "taxa": taxa, "patterns": patterns, "batch": size, "median_ms": 1e3 * median,
                   "per_tree_ms": 1e3 * median / size, "vs_one": median / single, "compile_s": first - median}
            rows.append(row)
            print(f"{taxa:>5} {patterns:>6} {size:>6} | {row['median_ms']:>9.3f} {row['per_tree_ms']:>11.4f} "
                  f"{row['vs_one']:>7.2f} | {row['compile_s']:>9.2f}", flush=True)
    record = device_record("batch")
    record.update(rows=rows)
    save(record, args.out, "batch")


if __name__ == "__main__":
    main()
