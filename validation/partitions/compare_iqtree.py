"""Partitioned ML beside IQ-TREE 2: fits on a fixed topology (-p, -q, -Q with -te) and -p and -Q tree searches.

Data: the built-in example split in two genes (HKY+G4 on sites 1-300, GTR+F+I on 301-600), and a simulated
two-gene set (10 taxa; HKY+G4 on 600 sites, JC at three times the rate on 600 more). Fits: `ml.fit` against
`iqtree2 -p|-q|-Q FILE -te TREE`. Search: `ml.search` (BIONJ start, patience 4, batch 2; its time includes
compilation: one call per process) against `iqtree2 -p|-Q FILE` (default search), both with one thread, in
the same run; for -Q also each part's tree length, ours and IQ-TREE's (`.parttrees`). Writes results.json beside this script; takes a few minutes.

    python validation/partitions/compare_iqtree.py

A third search runs on real data: `../shared/data/primates_mtDNA` split by codon position (-Q).
"""

from __future__ import annotations

import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

import jaxphylo as jp
from jaxphylo import ml

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "shared" / "data"  # ../shared/data beside the checkout
LINKS = {"-p": "proportional", "-q": "equal", "-Q": "unlinked"}


def write_partition(path: Path, models: str, cut: int, end: int) -> Path:
    path.write_text(f"#nexus\nbegin sets;\ncharset g1 = 1-{cut};\ncharset g2 = {cut + 1}-{end};\n"
                    f"charpartition m = {models};\nend;\n")
    return path


def simulated(folder: Path):
    truth = jp.random_topology_tree([f"s{i}" for i in range(10)], seed=11, mean_branch_length=0.08)
    truth = truth.with_branch_lengths(np.asarray(truth.branch_lengths) + 0.04)
    first = jp.simulate(truth, jp.parse_model("HKY{3}+F{0.3,0.2,0.2,0.3}+G4{0.8}"), 600, seed=5)
    second = jp.simulate(truth.with_branch_lengths(3 * np.asarray(truth.branch_lengths)), jp.parse_model("JC"), 600,
                         seed=6)
    path = folder / "genes.fasta"
    path.write_text("".join(f">{t}\n{x}{y}\n" for t, x, y in zip(first.taxa, first.sequences, second.sequences)))
    jp.write_tree(truth, folder / "truth.nwk")
    return path, folder / "truth.nwk", write_partition(folder / "genes.nex", "HKY+G4:g1, JC:g2", 600, 1200)


def iqtree(arguments: list[str], prefix: Path) -> tuple[float, float]:
    """(log L of the tree, wall seconds) of one `iqtree2` run with one thread."""
    start = time.perf_counter()
    subprocess.run(["iqtree2", *arguments, "-pre", str(prefix), "-redo", "-quiet", "-nt", "1", "-seed", "1",
                    "-keep-ident"], check=True, capture_output=True, timeout=3600)
    seconds = time.perf_counter() - start
    text = prefix.with_suffix(".iqtree").read_text()
    return float(text.split("Log-likelihood of the tree:")[1].split()[0]), seconds


def fits(name, alignment_path, tree_path, partition, folder) -> dict:
    alignment, tree = jp.read_alignment(alignment_path), jp.read_tree(tree_path)
    rows = {}
    for flag, link in LINKS.items():
        theirs, their_seconds = iqtree(["-s", str(alignment_path), flag, str(partition), "-te", str(tree_path)],
                                       folder / f"{name}{flag[1]}")
        start = time.perf_counter()
        ours = ml.fit(alignment, tree, jp.partitioned_model(jp.read_partitions(partition), alignment, link=link))
        rows[flag] = {"ours": round(ours.log_likelihood, 4), "iqtree": theirs,
                      "ours_minus_iqtree": round(ours.log_likelihood - theirs, 4),
                      "ours_seconds": round(time.perf_counter() - start, 2), "iqtree_seconds": round(their_seconds, 2)}
        print(name, flag, rows[flag], flush=True)
    return rows


def search(alignment_path, truth_path, partition, folder, flag="-p") -> dict:
    alignment = jp.read_alignment(alignment_path)
    truth = jp.read_tree(truth_path) if truth_path else None
    start = time.perf_counter()
    ours = ml.search(alignment, jp.partitioned_model(jp.read_partitions(partition), alignment, link=LINKS[flag]),
                     settings=ml.SearchSettings(patience=4, batch=2), seed=1)
    seconds = time.perf_counter() - start
    theirs, their_seconds = iqtree(["-s", str(alignment_path), flag, str(partition)], folder / f"search{flag[1]}")
    their_tree = jp.read_tree(folder / f"search{flag[1]}.treefile")
    row = {"ours": {"log_likelihood": round(ours.log_likelihood, 4), "seconds": round(seconds, 2),
                    "rf_to_truth": truth and ml.robinson_foulds(ours.tree, truth), "rf_to_iqtree": ml.robinson_foulds(
                        ours.tree, their_tree)},
           "iqtree": {"log_likelihood": theirs, "seconds": round(their_seconds, 2),
                      "rf_to_truth": truth and ml.robinson_foulds(their_tree, truth)},
           "seconds_ratio_ours_over_iqtree": round(seconds / their_seconds, 2)}
    if flag == "-p":
        row["ours"]["part_rates"] = ours.parameters["part_rates"]
    else:  # every part's tree length
        row["ours"]["part_tree_lengths"] = np.round(np.asarray(ours.model.branch_lengths).sum(1), 4).tolist()
        their_parts = (folder / f"search{flag[1]}.parttrees").read_text().split(";")
        row["iqtree"]["part_tree_lengths"] = [round(float(np.sum(jp.parse_newick(t + ";").branch_lengths)), 4)
                                              for t in their_parts if t.strip()]
    return row


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA), help="folder of the data sets (default ../shared/data)")
    parser.add_argument("--out", default=str(HERE / "results.json"), help="(results-gpu.json: on the H100 machine)")
    parser.add_argument("--searches-only", action="store_true", help="the -p/-Q searches, not the fits")
    args = parser.parse_args()
    version = subprocess.run(["iqtree2", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    results = {"machine": {"platform": platform.platform(), "jax_backend": jax.default_backend(),
                           "device": str(jax.devices()[0]), "iqtree": version}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        example_alignment, example_tree = jp.example_paths()
        example = write_partition(folder / "example.nex", "HKY+G4:g1, GTR+F+I:g2", 300, 600)
        alignment, truth, partition = simulated(folder)
        if not args.searches_only:
            results["fits_example"] = fits("example", example_alignment, example_tree, example, folder)
            results["fits_simulated"] = fits("simulated", alignment, truth, partition, folder)
        results["search_simulated"] = search(alignment, truth, partition, folder)
        results["search_simulated_Q"] = search(alignment, truth, partition, folder, "-Q")
        # Real data: primates mtDNA (12 taxa, 898 sites) by codon position, HKY+G4 each, unlinked lengths.
        positions = folder / "positions.nex"
        positions.write_text("#nexus\nbegin sets;\ncharset pos1 = 1-898\\3;\ncharset pos2 = 2-898\\3;\n"
                             "charset pos3 = 3-898\\3;\ncharpartition m = HKY+G4:pos1, HKY+G4:pos2, HKY+G4:pos3;\n"
                             "end;\n")
        results["search_primates_Q"] = search(Path(args.data) / "primates_mtDNA" / "alignment.fasta", None, positions,
                                               folder,
                                               "-Q")
    searches = ("search_simulated", "search_simulated_Q", "search_primates_Q")
    print(json.dumps({k: results[k] for k in searches}, indent=1))
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
