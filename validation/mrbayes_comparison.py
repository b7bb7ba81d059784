"""jaxphylo's NUTS against MrBayes 3.2 on the same alignment, fixed topology, model and priors.

    python validation/mrbayes_comparison.py [--data ../shared/data/primates_mtDNA] [--ngen 1000000]

Runs MrBayes with `validation/mrbayes/hky_g4_fixed_topology.nex` and jaxphylo with
`--priors mrbayes`, then compares the posterior means of tree length, kappa and
the Gamma shape: each difference in units of the combined Monte-Carlo standard
error `sqrt(se_mb^2 + se_nuts^2)`, `se = sd / sqrt(ESS)`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
from numpyro.diagnostics import effective_sample_size
from numpyro.infer import MCMC, NUTS, init_to_value

import jaxphylo as jp
from jaxphylo.inference import Analysis, prepare

HERE = Path(__file__).resolve().parent
COMMANDS = HERE / "mrbayes" / "hky_g4_fixed_topology.nex"
COLUMNS = {"tree_length": "TL", "kappa": "kappa", "gamma_shape": "alpha"}


def start_tree(alignment) -> jp.Tree:
    """The fixed topology: BIONJ on K2P distances (unrooted)."""
    return jp.bionj(jp.distances(alignment, "k2p", saturated=5.0), alignment.taxa)


def write_data(alignment, tree, folder: Path) -> None:
    rows = "\n".join(f"    {t} {s}" for t, s in zip(alignment.taxa, alignment.sequences))
    newick = jp.io.to_dendropy(tree).as_string(schema="newick", suppress_rooting=True,
                                                 unquoted_underscores=True).strip()
    (folder / "data.nex").write_text(
        f"#NEXUS\nbegin data;\n  dimensions ntax={len(alignment.taxa)} nchar={alignment.num_sites};\n"
        f"  format datatype=dna missing=? gap=-;\n  matrix\n{rows}\n  ;\nend;\n"
        f"begin trees;\n  tree fixed = {newick}\nend;\n")


def run_mrbayes(alignment, tree, folder: Path, ngen: int) -> tuple[dict, float]:
    """Post-burn-in (25%) draws of each run, `{column: [runs, draws]}`, and the wall time."""
    folder.mkdir(parents=True, exist_ok=True)
    write_data(alignment, tree, folder)
    (folder / "run.nex").write_text(COMMANDS.read_text().replace("NGEN", str(ngen)))
    start = time.perf_counter()
    subprocess.run([shutil.which("mb") or "mb", "run.nex"], cwd=folder, check=True, capture_output=True,
                   timeout=7200)
    seconds = time.perf_counter() - start
    runs = []
    for k in (1, 2):
        table = np.genfromtxt(folder / f"mb.run{k}.p", names=True, skip_header=1, delimiter="\t")
        runs.append(table[len(table) // 4:])
    return {name: np.stack([r[column] for r in runs]) for name, column in COLUMNS.items()}, seconds


def run_nuts(alignment, tree, chains: int, warmup: int, samples: int, seed: int = 1):
    """`{name: [chains, draws]}` from jaxphylo's NUTS with MrBayes's priors, and the wall time after compiling."""
    prepared = prepare(alignment, tree, Analysis("HKY+G4", priors="mrbayes", branch_rate=10.0))
    method = "sequential" if jax.default_backend() == "cpu" else "vectorized"
    mcmc = MCMC(NUTS(prepared.model, init_strategy=init_to_value(values=prepared.init)), num_warmup=warmup,
                num_samples=samples, num_chains=chains, chain_method=method, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), prepared.data)
    seconds = time.perf_counter() - start
    draws = mcmc.get_samples(group_by_chain=True)
    return {name: np.asarray(draws[name]) for name in COLUMNS}, draws, seconds


def compare(mb: dict, nuts: dict) -> dict:
    """Per parameter: both means, both Monte-Carlo standard errors, and the difference in combined SEs."""
    rows = {}
    for name in COLUMNS:
        summary = []
        for draws in (mb[name], nuts[name]):
            ess = float(effective_sample_size(draws))
            summary.append((float(draws.mean()), float(draws.std()) / np.sqrt(ess), ess))
        (m1, se1, ess1), (m2, se2, ess2) = summary
        rows[name] = {"mrbayes_mean": m1, "mrbayes_se": se1, "mrbayes_ess": ess1, "nuts_mean": m2,
                      "nuts_se": se2, "nuts_ess": ess2, "z": (m2 - m1) / np.hypot(se1, se2)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(HERE.parents[1] / "shared" / "data" / "primates_mtDNA"))
    parser.add_argument("--ngen", type=int, default=1_000_000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--work", default="mrbayes-work")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    alignment = jp.read_alignment(Path(args.data) / "alignment.fasta")
    tree = start_tree(alignment)
    mb, mb_seconds = run_mrbayes(alignment, tree, Path(args.work), args.ngen)
    nuts, _, nuts_seconds = run_nuts(alignment, tree, args.chains, args.warmup, args.samples)
    rows = compare(mb, nuts)
    print(f"{'parameter':<14}{'MrBayes':>12}{'±se':>9}{'ESS':>7}{'NUTS':>12}{'±se':>9}{'ESS':>7}{'z':>7}")
    for name, r in rows.items():
        print(f"{name:<14}{r['mrbayes_mean']:>12.5g}{r['mrbayes_se']:>9.2g}{r['mrbayes_ess']:>7.0f}"
              f"{r['nuts_mean']:>12.5g}{r['nuts_se']:>9.2g}{r['nuts_ess']:>7.0f}{r['z']:>7.2f}")
    print(f"MrBayes {mb_seconds:.1f} s ({args.ngen} generations x 2 runs); NUTS {nuts_seconds:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "mrbayes_seconds": mb_seconds,
                                               "nuts_seconds": nuts_seconds, "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
