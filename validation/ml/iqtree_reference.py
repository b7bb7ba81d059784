"""IQ-TREE 2 reference results for maximum-likelihood tree search and fixed-topology fits.

    python validation/ml/iqtree_reference.py

Writes, next to this file:

- `iqtree_reference.json`: IQ-TREE version, CPU count, date, notes, and one record per run
  (dataset, kind "search" or "fit", model, threads, command, seconds, log_likelihood, tree,
  parameters as printed in IQ-TREE's `.iqtree` report). The JSON is rewritten after every
  run so partial results survive an interruption.
- `iqtree_<dataset>_nt1.treefile`: the ML tree of each single-thread search.
- `primates_tree.nwk`: the HKY+G4 ML tree of primates_mtDNA, the fixed topology of its fits.

Searches: GTR+G4, `-seed 1`, with `-nt 1` and then `-nt <os.cpu_count()>` (explicit, not
`-nt AUTO`), on DS1, DS2, DS3 and, last because it is slow, carnivores.
Fits (`-te TREE`: topology fixed, branch lengths and model parameters optimised):
GTR+G4 and HKY+I+G4 on DS1 (its `tree.nwk`) and on primates_mtDNA (the tree above), each
twice: with IQ-TREE's default likelihood epsilon (0.01) and with `--epsilon 1e-6`; use the
tight ones as optimisation targets (the default stops early on the flat pinv-alpha ridge).
IQ-TREE's intermediate files go to a temporary folder; the alignments are only read.
Seconds are wall time around the subprocess, including IQ-TREE's start-up and parsing.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
OUT = HERE / "iqtree_reference.json"
TIMEOUT = 40 * 60
TIGHT = 1e-6  # --epsilon for the tight fits; IQ-TREE's default is 0.01 ('-eps' does not set it)
NUM = r"(-?[\d.]+(?:[eE][-+]?\d+)?)"


def parse_report(text: str) -> tuple[float, dict]:
    """Log-likelihood and model parameters from an IQ-TREE `.iqtree` report."""
    logl = float(re.search(r"Log-likelihood of the tree: " + NUM, text).group(1))
    params: dict = {"model": re.search(r"Model of substitution: (\S+)", text).group(1)}
    rates = re.findall(r"^\s+([ACGT]-[ACGT]): " + NUM + r"\s*$", text, re.M)
    if rates:
        params["rates"] = {k: float(v) for k, v in rates}
    freqs = re.findall(r"pi\(([ACGT])\) = " + NUM, text)
    if freqs:
        params["frequencies"] = {k: float(v) for k, v in freqs}
        params["frequency_type"] = re.search(r"State frequencies: (.*)", text).group(1).strip()
    for key, label in [("gamma_alpha", "Gamma shape alpha"), ("pinv", "Proportion of invariable sites")]:
        m = re.search(label + r": " + NUM, text)
        if m:
            params[key] = float(m.group(1))
    m = re.search(r"Total wall-clock time used: " + NUM, text)
    params["iqtree_reported_wall_seconds"] = float(m.group(1)) if m else None
    return logl, params


def splits(newick: str) -> set[frozenset]:
    """Nontrivial bipartitions of an unrooted Newick tree (each as the side without the first taxon)."""
    tokens = re.findall(r"'[^']*'|[(),;]|[^(),:;]+(?=[:),;])|:[^(),;]+", newick)
    stack, clades, taxa = [[]], [], []
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            clade = stack.pop()
            clades.append(frozenset(clade))
            stack[-1].extend(clade)
        elif tok not in ",;" and not tok.startswith(":"):
            taxa.append(tok.strip("'"))
            stack[-1].append(taxa[-1])
    everything = frozenset(taxa)
    out = set()
    for c in clades:
        side = everything - c if taxa[0] in c else c
        if 1 < len(side) < len(everything) - 1:
            out.add(side)
    return out


def run_iqtree(args: list[str], prefix: Path) -> dict:
    cmd = ["iqtree2", *args, "-pre", str(prefix), "-redo", "-quiet", "-keep-ident"]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, timeout=TIMEOUT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    logl, params = parse_report(Path(f"{prefix}.iqtree").read_text())
    log = Path(f"{prefix}.log").read_text()
    renamed = dict(re.findall(r"NOTE: Change sequence name '([^']*)' -> (\S+)", log))
    return {
        "command": [c.replace(str(prefix.parent), "<tmpdir>") for c in cmd],
        "seconds": round(seconds, 3),
        "load_average_1min_before": round(load, 2),
        "log_likelihood": logl,
        "tree": Path(f"{prefix}.treefile").read_text().strip(),
        "parameters": params,
        "renamed_taxa": renamed,
    }


def main() -> None:
    version = subprocess.run(["iqtree2", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    ncpu = os.cpu_count()
    result = {
        "iqtree_version": version,
        "cpu_count": ncpu,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "notes": [
            f"Multi-thread searches use an explicit '-nt {ncpu}' (os.cpu_count()), not '-nt AUTO', "
            "which benchmarks thread counts first and may choose fewer.",
            "IQ-TREE's default frequencies for GTR and HKY are empirical (+F): the fitted model is "
            "GTR+F+G4 / HKY+F+I+G4 and the base frequencies are the alignment's counts, not ML estimates.",
            "IQ-TREE prints parameters with 4 significant digits and log-likelihoods with 4 decimals.",
            "Fits with IQ-TREE's default likelihood epsilon (0.01) can stop short of the optimum "
            "(flat pinv-alpha ridge under +I+G4); the --epsilon 1e-6 fits are the better targets.",
            "IQ-TREE bounds branch lengths below by 1e-6 (-blmin): near-zero branches end at or "
            "just above it.",
            "No data set here is protein (all are nucleotide), so there is no LG+G4 reference; "
            "translating carnivores (mitochondrial code, stop codons) was judged out of scope.",
            "'seconds' is wall time of the whole iqtree2 process (start-up, parsing, parsimony tree, "
            "search); 'iqtree_reported_wall_seconds' is IQ-TREE's own figure. Timings are only as good "
            "as the machine was idle: see 'load_average_1min_before' (other jobs may share the cores).",
        ],
        "runs": [],
    }

    def record(run: dict) -> dict:
        result["runs"].append(run)
        OUT.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{run['dataset']:15s} {run['kind']:6s} {run['model']:9s} nt={run['threads']} "
              f"eps={run.get('epsilon', '-')!s:6s} {run['seconds']:9.2f} s  "
              f"logL {run['log_likelihood']:.4f}", flush=True)
        return run

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def search(name: str, model: str, nt: int, tag: str) -> dict:
            aln = DATA / name / "alignment.fasta"
            args = ["-s", str(aln), "-m", model, "-seed", "1", "-nt", str(nt)]
            run = run_iqtree(args, tmp / f"{name}_{tag}")
            return record({"dataset": name, "kind": "search", "model": model, "threads": nt, **run})

        def fit(name: str, tree: Path, model: str, epsilon: float | None = None) -> dict:
            aln = DATA / name / "alignment.fasta"
            args = ["-s", str(aln), "-te", str(tree), "-m", model, "-nt", "1", "-seed", "1"]
            args += ["--epsilon", str(epsilon)] if epsilon else []
            run = run_iqtree(args, tmp / f"{name}_fit_{model.replace('+', '')}_{epsilon}")
            return record({"dataset": name, "kind": "fit", "model": model, "threads": 1,
                           "epsilon": epsilon or 0.01, "fixed_tree": str(tree), **run})

        def searches(name: str) -> None:
            one = search(name, "GTR+G4", 1, "nt1")
            shutil.copy(tmp / f"{name}_nt1.treefile", HERE / f"iqtree_{name}_nt1.treefile")
            many = search(name, "GTR+G4", ncpu, f"nt{ncpu}")
            rf = len(splits(one["tree"]) ^ splits(many["tree"]))
            many["rf_distance_to_nt1_tree"] = rf
            given = DATA / name / "tree.nwk"  # names with spaces: compare as IQ-TREE writes them
            if given.exists():
                one["rf_distance_to_dataset_tree_nwk"] = len(
                    splits(one["tree"]) ^ splits(given.read_text().replace(" ", "_")))
            if one["renamed_taxa"]:
                new = list(one["renamed_taxa"].values())
                result["notes"].append(
                    f"{name}: IQ-TREE replaced characters in {len(new)} taxon names (spaces -> '_') and "
                    f"writes the new names in its trees ({'no' if len(set(new)) == len(new) else 'SOME'} "
                    "collisions); map back with each run's 'renamed_taxa'.")
            OUT.write_text(json.dumps(result, indent=1) + "\n")

        for name in ["DS1", "DS2", "DS3"]:
            searches(name)

        fits = [(m, e) for m in ["GTR+G4", "HKY+I+G4"] for e in [None, TIGHT]]
        for model, eps in fits:
            fit("DS1", DATA / "DS1" / "tree.nwk", model, eps)
        search("primates_mtDNA", "HKY+G4", 1, "hkyg4")
        primates_tree = HERE / "primates_tree.nwk"
        shutil.copy(tmp / "primates_mtDNA_hkyg4.treefile", primates_tree)
        for model, eps in fits:
            fit("primates_mtDNA", primates_tree, model, eps)

        searches("carnivores")


if __name__ == "__main__":
    main()
