"""jaxphylo's side of the BEAST comparison: the same model, priors and data as `beast_xml.py` writes.

    python validation/dated/run_jaxphylo.py --dataset dengue4_env --clock strict --tree-prior constant \
        --generations 200000 --out validation/dated/ours/dengue4_env_strict_constant.json

HKY+FO+G4 (frequencies estimated, Dirichlet(1)), kappa LogNormal(1, 1.25),
Gamma shape Exponential(1) (with `--median-gamma` HKY+FO+G4m: each category's
median rate, as BEAST 1.10's GammaSiteRateModel takes it, so that the two shapes
are the same parameter; without it the category means, as IQ-TREE and MrBayes),
the CTMC reference prior on the clock rate, 1/N on the constant population
size (or the skygrid with the same cutoff and intervals), ucld.stdev Exponential(mean 1/3); tip dates exact decimal years
(BEAST reads `1982` as 1982.0, so the dates are written as such; `jaxphylo
sample` would read a bare year as the whole year). Every chain's log and trees
go to `--work`; the JSON has, per log column, the median, 95% HPD and ESS
(`arviz.ess`, bulk, per chain and summed: the chains run at once), ESS per
hour of wall time with and without compilation, and clade frequencies. Where
ArviZ is missing (the lent GPU machine) the JSON keeps every column's draws
instead, and `--fill-ess --out FILE` computes the ESS later where it is. The
summaries use the same estimators as `summarise.py` uses for BEAST's logs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxphylo as jp  # noqa: E402
from jaxphylo.inference.dated import DatedSettings, clade_frequencies, dated_mcmc, hpd  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "shared" / "data"


def exact_dates(path: Path) -> Path:
    """The dates file with every date written as a decimal year (exact, as BEAST reads a bare year)."""
    lines = path.read_text().splitlines()
    out = Path(tempfile.mkdtemp()) / "dates.tsv"
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    out.write_text(lines[0] + "\n" + "".join(f"{t}\t{float(d):.6f}\n" for t, d in rows))
    return out


def read_dataset(folder: Path):
    """`(alignment, tip dates)` of a data set's folder (`alignment.fasta`, `dates.tsv` read as exact years)."""
    return jp.read_alignment(folder / "alignment.fasta"), jp.io.read_tip_dates(exact_dates(folder / "dates.tsv"))


def summed_ess(values) -> float:
    """ArviZ's bulk ESS of each chain's draws (`[chains, draws]`), summed over the chains (they run at once)."""
    import arviz  # here, not above: a GPU machine without ArviZ runs moves.py, whose ESS is computed later

    return float(sum(arviz.ess(np.asarray(chain)[np.newaxis], method="bulk") for chain in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--clock", choices=("strict", "relaxed"), default="strict")
    parser.add_argument("--tree-prior", choices=("constant", "skygrid"), default="constant")
    parser.add_argument("--skygrid-cutoff", type=float, default=50.0)
    parser.add_argument("--generations", type=int, default=200_000)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--heats", type=int, default=1, help="chains per run, Metropolis-coupled (1: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--median-gamma", action="store_true",
                        help="HKY+FO+G4m: BEAST 1.10's median category rates (default: HKY+FO+G4, mean rates)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the run's logs and trees")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fill-ess", action="store_true",
                        help="compute the ESS of a record --out written where ArviZ was missing (it kept the series)")
    args = parser.parse_args()
    if args.fill_ess:
        args.out.write_text(json.dumps(with_ess(json.loads(args.out.read_text())), indent=1) + "\n")
        return

    alignment, dates = read_dataset(args.data / args.dataset)
    settings = DatedSettings(chains=args.chains, heats=args.heats, generations=args.generations,
                             sample_every=args.sample_every, block=max(1, args.generations // args.sample_every // 10))
    stamps = []
    began = time.perf_counter()
    model = "HKY+FO+G4m" if args.median_gamma else "HKY+FO+G4"
    result = dated_mcmc(alignment, model, dates, clock=args.clock,
                        tree_prior="coalescent" if args.tree_prior == "constant" else "skygrid", settings=settings,
                        skygrid_cutoff=args.skygrid_cutoff, seed=args.seed, out=args.work,
                        progress=lambda g, _: stamps.append((g, time.perf_counter() - began)))
    wall = time.perf_counter() - began
    first_block = stamps[0][1]
    steady = (wall - first_block) * len(stamps) / max(len(stamps) - 1, 1)  # every block at the later blocks' pace
    record = {"program": f"jaxphylo (free topology), JAX {jax.__version__}", "dataset": args.dataset,
              "clock": args.clock, "tree_prior": args.tree_prior, "model": model, "device": str(jax.devices()[0]),
              "platform": platform.platform(), "chains": args.chains, "heats": args.heats,
              "generations_per_chain": args.generations,
              "sample_every": args.sample_every, "wall_seconds": wall, "first_block_seconds": first_block,
              "steady_seconds": steady, "acceptance": result.acceptance, "reference_year": result.reference,
              "burnin_fraction": result.burnin, "columns": {}, "series": {}}
    for name in result.samples.names:
        values = result.samples.column(name, result.burnin)  # [chains, draws]
        low, high = hpd(values.ravel())
        record["columns"][name] = {"median": float(np.median(values)), "mean": float(np.mean(values)),
                                   "sd": float(np.std(values)), "hpd_95": [low, high]}
        record["series"][name] = values.tolist()
    if importlib.util.find_spec("arviz") is not None:
        record = with_ess(record)
    taxa = result.taxa
    frequency = clade_frequencies(result.samples.kept_trees(result.burnin))
    everyone = (1 << len(taxa)) - 1
    record["clades"] = sorted(([sorted(taxa[t] for t in range(len(taxa)) if mask >> t & 1), f]
                               for mask, f in frequency.items() if f >= 0.05 and mask != everyone),
                              key=lambda item: -item[1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    root = record["columns"]["age(root)"]
    print(f"{args.dataset} {args.clock} {args.tree_prior}: age(root) {root['median']:.2f} "
          f"[{root['hpd_95'][0]:.2f}, {root['hpd_95'][1]:.2f}], ESS {root.get('ess', float('nan')):.0f}, "
          f"{wall:.1f} s ({first_block:.1f} s first block)")


def with_ess(record: dict) -> dict:
    """The record with every column's summed ESS and ESS per hour (with and without compilation), its series
    dropped."""
    record = dict(record, ess_per_hour={}, ess_per_hour_without_compile={})
    for name, values in record.pop("series").items():
        ess = summed_ess(values)
        record["columns"][name]["ess"] = ess
        record["ess_per_hour"][name] = ess / record["wall_seconds"] * 3600
        record["ess_per_hour_without_compile"][name] = ess / record["steady_seconds"] * 3600
    return record


if __name__ == "__main__":
    main()
