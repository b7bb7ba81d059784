"""Our ultrafast bootstrap (`ml.search(..., ufboot=1000)`, `jaxphylo ml -B 1000`) next to IQ-TREE 2's `-B 1000`.

    python validation/ml/ufboot_vs_iqtree.py --iqtree --sets DS1,DS2,DS3     # IQ-TREE, this machine
    python validation/ml/ufboot_vs_iqtree.py --ours --sets DS1,DS2,DS3       # ours, this machine's default device
    python validation/ml/ufboot_vs_iqtree.py --compare                       # the table, from the two JSON files

IQ-TREE runs where it is installed (the device machine has none), so the two
halves may run on different machines: each half writes its own JSON (with
the machine, the load before each run and the seconds), `--compare` joins
them. Both run GTR+G4 with one fixed seed for every set (no per-set tuning);
ours with the default search settings and without `-bnni`, as IQ-TREE's
default `-B` is (`--bnni` adds it to ours). The comparison is the rule of issue
#40: on the splits the two ML trees share, the mean absolute difference of
the supports (target ≤ 5), and the two wall times (ours: compilation
included, and the search apart). `--bnni` runs both with `-bnni` (rows
`SET+bnni`). `--sbs` runs IQ-TREE's standard bootstrap (`-b 100`) for
context: what both ultrafast bootstraps approximate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import jaxphylo as jp
from jaxphylo import ml

HERE = Path(__file__).resolve().parent
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MODEL = "GTR+G4"
SEED = 1
REPLICATES = 1000
OURS, THEIRS, TABLE = HERE / "ufboot_ours.json", HERE / "ufboot_iqtree.json", HERE / "ufboot_vs_iqtree.json"
SBS = HERE / "ufboot_iqtree_sbs.json"  # IQ-TREE's standard bootstrap (-b 100), for context


def labelled_splits(tree: jp.Tree) -> dict[frozenset, float]:
    """The support labels of a tree's internal branches, by split."""
    labels = tree.topology.labels or ()
    return {split: float(labels[node]) for split, node in ml.splits(tree).items()
            if node < len(labels) and labels[node] not in (None, "")}


def renamed_tree(tree: jp.Tree, alignment) -> jp.Tree:
    """IQ-TREE writes '_' for spaces in names: back to the alignment's names."""
    renamed = {t.replace(" ", "_"): t for t in alignment.taxa}
    return jp.Tree(tree.branch_lengths, jp.Topology(tree.topology.parent, tuple(renamed.get(t, t) for t in tree.taxa),
                                                    False, tree.topology.labels))


def run_iqtree(name: str, folder: Path, bnni: bool) -> dict:
    aln = DATA / name / "alignment.fasta"
    prefix = folder / name
    command = ["iqtree2", "-s", str(aln), "-m", MODEL, "-B", str(REPLICATES), "-nt", "1", "-seed", str(SEED),
               "-pre", str(prefix), "-redo", "-quiet", "-keep-ident"] + (["-bnni"] if bnni else [])
    load, began = os.getloadavg()[0], time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=7200)
    seconds = time.perf_counter() - began
    report = Path(f"{prefix}.iqtree").read_text()
    return {"command": " ".join(command).replace(str(folder), "<tmp>"), "seconds": round(seconds, 2),
            "load_before": round(load, 2),
            "log_likelihood": float(re.search(r"Log-likelihood of the tree: (-?[\d.]+)", report).group(1)),
            "tree": Path(f"{prefix}.treefile").read_text().strip()}


def run_standard_bootstrap(name: str, folder: Path) -> dict:
    """IQ-TREE's standard non-parametric bootstrap (`-b 100`): what both ultrafast bootstraps approximate."""
    prefix = folder / f"{name}_sbs"
    command = ["iqtree2", "-s", str(DATA / name / "alignment.fasta"), "-m", MODEL, "-b", "100", "-nt", "1", "-seed",
               str(SEED), "-pre", str(prefix), "-redo", "-quiet", "-keep-ident"]
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=14400)
    return {"command": " ".join(command).replace(str(folder), "<tmp>"), "seconds": round(time.perf_counter() - began, 2),
            "trees": [line for line in Path(f"{prefix}.boottrees").read_text().splitlines() if line.startswith("(")]}


def run_ours(name: str, bnni: bool) -> dict:
    alignment = jp.read_alignment(DATA / name / "alignment.fasta")
    load, began = os.getloadavg()[0], time.perf_counter()
    result = ml.search(alignment, MODEL, seed=SEED, ufboot=ml.UFBootSettings(REPLICATES, bnni=bnni))
    seconds = time.perf_counter() - began
    tree = ml.with_supports(result.tree, result.ufboot)
    return {"seconds": round(seconds, 2), "search_seconds": round(result.seconds, 2), "load_before": round(load, 2),
            "log_likelihood": result.log_likelihood, "rounds": result.search_rounds, "bnni": bnni,
            "tree": jp.io.to_dendropy(tree).as_string(schema="newick", suppress_rooting=True).strip()}


def machine() -> dict:
    import jax

    device = jax.devices()[0]
    return {"host": platform.node(), "device": getattr(device, "device_kind", device.platform),
            "jax": jax.__version__, "jaxphylo": jp.__version__, "cpus": os.cpu_count()}


def merged(path: Path, rows: dict, about: dict) -> None:
    old = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    old["rows"].update(rows)
    old["machine"] = about
    path.write_text(json.dumps(old, indent=1) + "\n")


def compare() -> dict:
    ours, theirs = json.loads(OURS.read_text()), json.loads(THEIRS.read_text())
    table = {"ours_machine": ours["machine"], "iqtree_machine": theirs["machine"], "rows": {}}
    print(f"{'set':<16}{'shared':>7}{'mean |diff|':>12}{'max |diff|':>11}{'ours s':>9}{'search s':>9}"
          f"{'IQ-TREE s':>10}{'ratio':>7}{'log L diff':>11}")
    for name in sorted(set(ours["rows"]) & set(theirs["rows"])):
        a, b = ours["rows"][name], theirs["rows"][name]
        alignment = jp.read_alignment(DATA / name.split("+")[0] / "alignment.fasta")
        supports_a = labelled_splits(jp.parse_newick(a["tree"]))
        tb = renamed_tree(jp.parse_newick(b["tree"]), alignment)
        supports_b = labelled_splits(tb)
        shared = sorted(set(supports_a) & set(supports_b), key=sorted)
        diff = np.abs([supports_a[s] - supports_b[s] for s in shared])
        sbs = json.loads(SBS.read_text())["rows"].get(name.split("+")[0]) if SBS.exists() else None
        if sbs is not None:  # split frequencies of IQ-TREE's standard bootstrap trees, on the shared splits
            found = [set(ml.splits(renamed_tree(jp.parse_newick(t), alignment))) for t in sbs["trees"]]
            frequency = {s: 100.0 * np.mean([s in f for f in found]) for s in shared}
        row = {"shared_splits": len(shared), "splits_ours": len(supports_a), "splits_iqtree": len(supports_b),
               "mean_abs_difference": float(diff.mean()), "max_abs_difference": float(diff.max()),
               "ours_seconds": a["seconds"], "ours_search_seconds": a["search_seconds"],
               "iqtree_seconds": b["seconds"], "time_ratio": a["seconds"] / b["seconds"],
               "log_likelihood_difference": a["log_likelihood"] - b["log_likelihood"], "bnni": a["bnni"],
               "splits": [{"taxa": sorted(s), "ours": supports_a[s], "iqtree": supports_b[s],
                           "iqtree_standard_bootstrap": None if sbs is None else frequency[s]} for s in shared]}
        if sbs is not None:
            row["standard_bootstrap_mean_abs_difference"] = {
                "ours": float(np.mean([abs(supports_a[s] - frequency[s]) for s in shared])),
                "iqtree_ufboot": float(np.mean([abs(supports_b[s] - frequency[s]) for s in shared]))}
        table["rows"][name] = row
        print(f"{name:<16}{len(shared):>7}{row['mean_abs_difference']:>12.2f}{row['max_abs_difference']:>11.1f}"
              f"{a['seconds']:>9.1f}{a['search_seconds']:>9.1f}{b['seconds']:>10.1f}{row['time_ratio']:>7.2f}"
              f"{row['log_likelihood_difference']:>11.3f}")
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    return table


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="DS1,DS2,DS3")
    parser.add_argument("--iqtree", action="store_true")
    parser.add_argument("--ours", action="store_true")
    parser.add_argument("--sbs", action="store_true", help="IQ-TREE's standard bootstrap (-b 100), for context")
    parser.add_argument("--bnni", action="store_true")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--data", type=Path, default=DATA, help="the folder of the sets (default ../shared/data)")
    args = parser.parse_args()
    DATA = args.data
    names = args.sets.split(",")
    if args.iqtree:
        with tempfile.TemporaryDirectory() as folder:
            for name in names:
                row = run_iqtree(name, Path(folder), args.bnni)
                print(f"IQ-TREE {name}: {row['seconds']} s, log L {row['log_likelihood']}", flush=True)
                merged(THEIRS, {name + ("+bnni" if args.bnni else ""): row}, {"host": platform.node(), "cpus": os.cpu_count(),
                                             "iqtree": subprocess.run(["iqtree2", "--version"], capture_output=True,
                                                                      text=True).stdout.splitlines()[0]})
    if args.sbs:
        with tempfile.TemporaryDirectory() as folder:
            for name in names:
                merged(SBS, {name: run_standard_bootstrap(name, Path(folder))}, {"host": platform.node()})
    if args.ours:
        for name in names:
            row = run_ours(name, args.bnni)
            print(f"ours {name}: {row['seconds']} s ({row['search_seconds']} s search), log L {row['log_likelihood']}",
                  flush=True)
            merged(OURS, {name + ("+bnni" if args.bnni else ""): row}, machine())
    if args.compare:
        compare()


if __name__ == "__main__":
    main()
