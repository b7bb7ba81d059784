"""float32 against float64 on the same device: relative error of log L, and time (issue #17).

    python benchmarks/float32.py [--out DIR]

Every matrix product of the likelihood runs at `Precision.HIGHEST` (a GPU would
otherwise use TF32, a 10-bit mantissa). Columns: the float64 log-likelihood;
the relative error of float32 with transition matrices computed in float64 and
cast (the default, as BEAGLE's single-precision mode keeps its eigensystem in
double), with the whole model in float32, and with products in TF32 (DEFAULT
precision, what a GPU does unasked); median times of each. Real data: DS1
(4 states), carnivores as codons (vertebrate mitochondrial code, 61 states
less its 60-codon table: stop codons masked as gaps) and translated to protein
(20 states); simulated protein and codon data beside them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

import jaxphylo as jp
from jaxphylo.runtime import set_product_precision
from jaxphylo.likelihood import pattern_data
from jaxphylo.likelihood import data_log_likelihood

from _common import SHARED_DATA, device_record, save, time_call

CASES = [
    ("DS1", "HKY{2}+F{.3,.2,.2,.3}+G4{0.5}", None),
    ("carnivores protein", "WAG", "protein"),
    ("carnivores protein", "LG+G4{0.7}", "protein"),
    ("carnivores codon", "GY{kappa=2,omega=0.3}+F3X4", "codon"),
    ("carnivores codon", "GY{kappa=2,omega=0.3}+F3X4+G4{0.5}", "codon"),
    ("simulated protein 100x1000", "WAG", ("protein", 100, 1000)),
    ("simulated protein 100x1000", "LG+G4{0.7}", ("protein", 100, 1000)),
    ("simulated protein 100x1000", "JTT+I{0.1}+G4{0.7}", ("protein", 100, 1000)),
    ("simulated codon 62x1000", "GY{kappa=2,omega=0.3}+FQ", ("codon", 62, 1000)),
    ("simulated codon 62x1000", "GY{kappa=2,omega=0.3}+FQ+G4{0.5}", ("codon", 62, 1000)),
]


def carnivores(kind: str) -> jp.Alignment:
    """carnivores as codons (NCBI table 2, stop codons masked) or their translation to protein."""
    from Bio.Data import CodonTable

    table = CodonTable.unambiguous_dna_by_id[2]
    raw = jp.read_alignment(SHARED_DATA / "carnivores" / "alignment.fasta")
    codons = [[seq[i:i + 3] for i in range(0, len(seq) - len(seq) % 3, 3)] for seq in raw.sequences]
    if kind == "codon":
        masked = ["".join(c if c in table.forward_table else "---" for c in row) for row in codons]
        return jp.Alignment(raw.taxa, tuple(masked), jp.codon_alphabet(2), "carnivores (codons)")
    protein = ["".join(table.forward_table.get(c, "-") for c in row) for row in codons]
    return jp.Alignment(raw.taxa, tuple(protein), jp.PROTEIN, "carnivores (protein)")


def case_data(name, string, simulated):
    if simulated in ("codon", "protein"):
        alignment = carnivores(simulated)
        model = jp.parse_model(string, alignment=alignment, genetic_code=2) if simulated == "codon" else jp.parse_model(string)
        tree = jp.read_tree(SHARED_DATA / "carnivores" / "tree.nwk")
        tree = tree.with_branch_lengths(tree.branch_lengths * 0.1 / float(jnp.mean(tree.branch_lengths)))
        return alignment, tree, model
    if simulated is None:
        alignment = jp.read_alignment(SHARED_DATA / name / "alignment.fasta")
        tree = jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa)
        return alignment, tree, jp.parse_model(string)
    kind, taxa, sites = simulated
    model = jp.parse_model(string, genetic_code=1) if kind == "codon" else jp.parse_model(string)
    tree = jp.random_topology_tree([f"t{i}" for i in range(taxa)], seed=1, mean_branch_length=0.05)
    return jp.simulate(tree, model, sites, seed=2), tree, model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}")
    print(f"{'case':>28} {'model':>34} | {'log L f64':>14} {'rel err f32':>11} {'(model f32)':>11} {'(TF32)':>9} | "
          f"{'f64 ms':>8} {'f32 ms':>8} {'(model f32)':>11} {'(TF32)':>8}")
    rows = []
    for name, string, simulated in CASES:
        folder = name.split()[0] if not name.startswith("simulated") else None
        if folder and not (SHARED_DATA / folder).exists():
            continue
        alignment, tree, model = case_data(name, string, simulated)
        data = pattern_data(alignment, tree)
        model32 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                                         model)
        tree32 = tree.with_branch_lengths(tree.branch_lengths.astype(jnp.float32))
        calls = {
            "f64": jax.jit(lambda d, t, m: data_log_likelihood(d, t, m)),
            "f32": jax.jit(lambda d, t, m: data_log_likelihood(d, t, m, precision="float32")),
        }
        row = {"case": name, "model": string}
        _, row["f64_ms"] = time_call(lambda: calls["f64"](data, tree, model), args.repeats)
        _, row["f32_ms"] = time_call(lambda: calls["f32"](data, tree, model), args.repeats)
        _, row["f32_model_ms"] = time_call(lambda: calls["f32"](data, tree32, model32), args.repeats)
        exact = float(calls["f64"](data, tree, model))
        row["log_likelihood"] = exact
        row["rel_error_f32"] = abs(float(calls["f32"](data, tree, model)) - exact) / abs(exact)
        row["rel_error_f32_model"] = abs(float(calls["f32"](data, tree32, model32)) - exact) / abs(exact)
        set_product_precision(lax.Precision.DEFAULT)  # TF32 on a GPU: what full precision is measured against
        jax.clear_caches()  # retrace: the compiled programs carry the precision they were traced with
        tf32 = jax.jit(lambda d, t, m: data_log_likelihood(d, t, m, precision="float32"))
        _, row["f32_tf32_ms"] = time_call(lambda: tf32(data, tree, model), args.repeats)
        row["rel_error_f32_tf32"] = abs(float(tf32(data, tree, model)) - exact) / abs(exact)
        set_product_precision(lax.Precision.HIGHEST)
        jax.clear_caches()
        for key in ("f64_ms", "f32_ms", "f32_model_ms", "f32_tf32_ms"):
            row[key] *= 1e3
        rows.append(row)
        print(f"{name:>28} {string:>34} | {exact:>14.4f} {row['rel_error_f32']:>11.2e} {row['rel_error_f32_model']:>11.2e} "
              f"{row['rel_error_f32_tf32']:>9.2e} | {row['f64_ms']:>8.3f} {row['f32_ms']:>8.3f} {row['f32_model_ms']:>11.3f} "
              f"{row['f32_tf32_ms']:>8.3f}", flush=True)
    record = device_record("float32")
    record.update(rows=rows)
    save(record, args.out, "float32")


if __name__ == "__main__":
    main()
