"""Variational inference on the standard benchmark (DS1-DS8 protocol: JC69, Exponential(10) edges, uniform topologies).

    python validation/vi/benchmark_ds.py --data DS1 --steps 200000 --anneal 50000 --out validation/vi/DS1_h100.json

Fits q with `jaxphylo.inference.vi.vi` and reports what the issue's table asks: the ELBO and the
importance-sampled log marginal likelihood (1,000 particles, repeated: mean and sd), the largest difference of
q's split frequencies from the 10-run golden posterior (DS1 has one: `topology_posterior_pooled.tsv`), the wall
time and the steps, beside the published figures (PhyloGen NeurIPS 2024, Tables 1-2: MrBayes stepping-stone,
ARTree, VBPI). Writes a JSON file and the run's folder (trace, trees, splits, consensus, plot) beside it.
`--minutes 55` sizes the run to a wall-time budget: three blocks are timed first (compilation apart), then
`--steps` becomes what fits in 90% of the budget less the estimates' time, and `--anneal` the fraction
`--anneal-fraction` of it. `--max-time 50m` stops the training saved; the same command with `--resume` continues it.

On a GPU (one command, about an hour):

    python validation/vi/benchmark_ds.py --data DS1 --minutes 55 --particles 20 --out validation/vi/DS1_gpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax

import jaxphylo as jp
from jaxphylo.inference.mc3 import RunSamples
from jaxphylo.inference.vi import VISettings, estimate, target_of, vi
from jaxphylo.runtime import Interrupted, StopRequests, parse_duration
from validation.mc3.golden import golden_split_probabilities

DATA = Path("/work/shared/data")
# PhyloGen (NeurIPS 2024) Tables 1-2, copying ARTree's and PhyloGFN's: value (sd)
PUBLISHED = {
    "DS1": {"mrbayes_ss_log_ml": (-7108.42, 0.18), "artree_log_ml": (-7108.41, 0.19), "artree_elbo": (-7110.09, 0.04),
            "vbpi_elbo": (-7110.24, 0.03)},
    "DS2": {"mrbayes_ss_log_ml": (-26367.57, 0.48), "artree_log_ml": (-26367.71, 0.07),
            "artree_elbo": (-26368.78, 0.07), "vbpi_elbo": (-26368.88, 0.03)},
    "DS3": {"mrbayes_ss_log_ml": (-33735.44, 0.50), "artree_log_ml": (-33735.09, 0.09),
            "artree_elbo": (-33735.25, 0.08), "vbpi_elbo": (-33736.22, 0.02)},
}


def sized(alignment, settings: VISettings, args) -> tuple[VISettings, dict]:
    """The settings with `steps` (a whole number of blocks) and `anneal` fitted to `args.minutes`, from three timed
    blocks and one timed batch of the estimates (the same programs as the run's: compiled once, timed after)."""
    stamps = []
    probe = replace(settings, steps=3 * settings.block, anneal=0, repeats=1, importance=settings.eval_batch,
                    tree_samples=1)
    start = time.perf_counter()
    fitted = vi(alignment, "JC", probe, seed=args.seed, progress=lambda *_: stamps.append(time.perf_counter()))
    per_step = (stamps[-1] - stamps[-2]) / settings.block
    one = time.perf_counter()
    *_, parents, lengths, _ = estimate(fitted.q, target_of(alignment, "JC", settings), probe, jax.random.PRNGKey(1))
    samples = RunSamples()
    for k in range(len(parents)):  # the host's share: every tree's splits
        samples.add(k, parents[k], lengths[k], alignment.taxa, [0.0])
    batches = settings.repeats * -(-settings.importance // settings.eval_batch)
    estimates = (time.perf_counter() - one) * batches
    budget = 0.9 * args.minutes * 60 - (time.perf_counter() - start) - estimates
    steps = max(1, int(budget / per_step) // settings.block) * settings.block
    sized_settings = replace(settings, steps=steps, anneal=int(args.anneal_fraction * steps))
    return sized_settings, {"seconds_per_step": per_step, "estimate_seconds": estimates, "steps": steps,
                            "anneal": sized_settings.anneal, "probe_seconds": time.perf_counter() - start}


def add_training_options(parser, *, steps: int, particles: int, anneal: int, lr: float, topology_rate: float,
                         population: int | None) -> None:
    """The data set and training options this script and `short_run.py` share, with each script's defaults."""
    parser.add_argument("--data", default="DS1", help="a folder under /work/shared/data (or a path) with "
                                                      "alignment.fasta")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--particles", type=int, default=particles)
    parser.add_argument("--anneal", type=int, default=anneal, help="steps of likelihood annealing (ARTree's schedule)")
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--topology-rate", type=float, default=topology_rate)
    parser.add_argument("--proximity", type=float, default=VISettings.proximity)
    parser.add_argument("--population", type=int, default=population)
    parser.add_argument("--explore", type=float, default=VISettings.explore)
    parser.add_argument("--selections", type=int, default=VISettings.selections)
    parser.add_argument("--seed", type=int, default=0)


def worst_split(result, folder: Path):
    """`(largest difference, {taxa, q, golden})` of q's split frequencies from the data set's golden posterior
    (`topology_posterior_pooled.tsv`), or None where it has none."""
    golden = folder / "topology_posterior_pooled.tsv"
    if not golden.exists():
        return None
    reference, ours = golden_split_probabilities(golden), result.split_frequencies()
    differences = {s: abs(ours.get(s, 0.0) - reference.get(s, 0.0)) for s in set(ours) | set(reference)}
    worst = max(differences, key=lambda s: (differences[s], sorted(s)))  # ties: the same split every run
    return differences[worst], {"taxa": sorted(worst), "q": ours.get(worst, 0.0), "golden": reference.get(worst, 0.0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(parser, steps=200_000, particles=10, anneal=50_000, lr=1e-3, topology_rate=0.1,
                         population=VISettings.population)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--importance", type=int, default=1000)
    parser.add_argument("--eval-batch", type=int, default=100)
    parser.add_argument("--minutes", type=float, help="size --steps (and --anneal) to this wall-time budget")
    parser.add_argument("--anneal-fraction", type=float, default=0.25, help="with --minutes: annealed share of steps")
    parser.add_argument("--max-time", help="stop the training saved after this long (e.g. 50m); --resume continues")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", required=True, help="JSON file; the run's folder is written beside it")
    args = parser.parse_args(argv)

    if args.minutes and args.resume:
        parser.error("--resume continues a run of given --steps/--anneal (the sized ones its first run printed), "
                     "not --minutes")
    folder = Path(args.data) if Path(args.data).is_dir() else DATA / args.data
    name = folder.name
    alignment = jp.read_alignment(folder / "alignment.fasta")
    settings = VISettings(steps=args.steps, particles=args.particles, learning_rate=args.lr,
                          topology_rate=args.topology_rate, anneal=args.anneal, proximity=args.proximity,
                          population=args.population, selections=args.selections, explore=args.explore,
                          width=args.width, block=args.block, repeats=args.repeats, importance=args.importance,
                          eval_batch=args.eval_batch)
    out = Path(args.out)
    run_folder = out.with_suffix("")
    began = time.perf_counter()
    calibration = None
    if args.minutes:
        settings, calibration = sized(alignment, settings, args)
        print(f"calibration: {calibration}", flush=True)

    def progress(step, bound, elbo):
        print(f"step {step}\tbound {bound:.2f}\tELBO {elbo:.2f}\t{time.perf_counter() - began:.0f} s", flush=True)

    try:
        with StopRequests(parse_duration(args.max_time)) as stop:
            result = vi(alignment, "JC", settings, seed=args.seed, out=run_folder, resume=args.resume,
                        progress=progress, stop=stop)
    except Interrupted as err:
        print(f"stopped: {err}", flush=True)
        return 75
    except jp.JaxphyloError as err:  # nothing to resume, a run of other settings in the folder: one line
        print(f"{out}: {err}", file=sys.stderr)
        return 2
    total = time.perf_counter() - began
    summary = result.summary()
    report = {
        "data": name, "taxa": len(alignment.taxa), "sites": alignment.num_sites,
        "patterns": alignment.site_patterns().num_patterns,
        "protocol": "JC69, edges i.i.d. Exponential(10), uniform topologies",
        "device": str(jax.devices()[0]), "platform": platform.platform(), "jax": jax.__version__,
        "settings": {k: getattr(settings, k) for k in ("steps", "particles", "learning_rate", "topology_rate",
                                                        "final_rate", "anneal", "proximity", "explore", "population",
                                                        "selections", "width", "depth", "block", "repeats",
                                                        "importance")},
        "calibration": calibration,
        "steps_done": result.steps,
        "kept_step": result.kept_step,
        "training_seconds_this_session": round(result.seconds, 1),
        "total_seconds_this_session": round(total, 1),
        "elbo": [summary["elbo_mean"], summary["elbo_sd"]],
        "log_ml_importance": [summary["log_ml_mean"], summary["log_ml_sd"]],
        "log_ml_repeats": summary["log_ml"],
        "published": PUBLISHED.get(name, {}),
    }
    if name in PUBLISHED:
        report["log_ml_minus_mrbayes_ss"] = summary["log_ml_mean"] - PUBLISHED[name]["mrbayes_ss_log_ml"][0]
        report["elbo_minus_artree_elbo"] = summary["elbo_mean"] - PUBLISHED[name]["artree_elbo"][0]
    if (worst := worst_split(result, folder)) is not None:
        report["max_split_difference_vs_golden"], report["worst_split"] = worst
    report["done_means"] = {
        "log_ml_within_0.2_of_mrbayes": abs(report.get("log_ml_minus_mrbayes_ss", float("inf"))) <= 0.2,
        "elbo_at_least_artree": report.get("elbo_minus_artree_elbo", float("-inf")) >= 0,
        "splits_within_0.05": report.get("max_split_difference_vs_golden", float("inf")) <= 0.05,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
