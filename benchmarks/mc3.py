"""MC³ speed beside MrBayes 3.2 on the same machine, in the same run: wall time to ASDSF < 0.01, generations per
second, and where a generation's time goes.

    python benchmarks/mc3.py [--cases DS1 carnivores] [--max-generations 1000000] [--no-mrbayes]

Both programs run 2 runs x 4 chains, heating 0.1, a sample every 100
generations, ASDSF over splits >= 0.1 after 25% burn-in, checked every 1,000
generations by MrBayes and after every block (`--block` samples) by jaxphylo.
DS1: JC69 (MrBayes `nst=1`, equal frequencies). carnivores: HKY+G4 with
MrBayes's priors (Dirichlet(1) frequencies, Beta(1, 1) on kappa/(1+kappa),
Exponential(1) shape): jaxphylo's `HKY+FO+G4` with `MRBAYES_PRIORS`. MrBayes
uses BEAGLE's CPU SSE kernel in double precision, one thread (`mb` on the
path; on the lent GPU machines a copy travels in the git-ignored .devtools/).

`--per-move`: ms per generation with each move alone (its own compiled block), the kept partials' cost of a
generation of that move.

`--fused K...`: ms per generation of NNI and branch multiplier (weights 3:5, as the defaults) when each
generation is followed by K more in one launch (`MC3Settings.fused_generations`, tgMC³'s fused kernel on a GPU;
K = 0: one generation per launch, the kept partials' path), for `--fused-runs` runs x 4 chains. `--run-fused K`:
the runs to the stop rule use it (their generations per second then count the K fused generations too, as
MrBayes counts one move per generation).

Breakdown rows (ms per generation, all 8 chains): the whole generation; the
moves and priors alone (`prior_only`); one batched likelihood of the 8
proposed trees alone. Their floor: the likelihood's bytes (partials of 8 trees
written once and read by their parents) over memory bandwidth.
Writes benchmarks/results/mc3-<platform>.{json,txt}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import jaxphylo as jp  # noqa: E402
from _common import SHARED_DATA, device_record, save  # noqa: E402
from jaxphylo.inference.mc3 import MC3Settings, run_block, starting_state  # noqa: E402
from jaxphylo.models import MRBAYES_PRIORS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validation" / "mc3"))
CASES = {"DS1": ("JC", "JC69"), "carnivores": ("HKY+FO+G4", "HKY+G4")}


def timed_block(alignment, model, priors, settings: MC3Settings, tune: int, prior_only: bool = False):
    """`(first call s, second call s, state after it)` of one compiled block of `settings.generations`
    generations (`block` samples of `sample_every`), from the same start both times."""
    posterior, state, key = starting_state(alignment, model, settings, priors=priors, prior_only=prior_only)
    count, tune = jnp.asarray(settings.block), jnp.asarray(tune)
    began = time.perf_counter()
    jax.block_until_ready(run_block(state, key, posterior, settings, count, tune))
    first = time.perf_counter() - began
    began = time.perf_counter()
    state, _, _ = jax.block_until_ready(run_block(state, key, posterior, settings, count, tune))
    return first, time.perf_counter() - began, state


def breakdown(alignment, model, priors, generations: int = 1000, runs: int = 2) -> dict:
    """Milliseconds per generation: whole (kept partials, the default; and every node recomputed, the
    reference), moves and priors alone, one batched likelihood of every node alone."""
    settings = MC3Settings(runs=runs, chains=4, generations=generations, sample_every=100, block=generations // 100)
    out = {}
    for name, prior_only, incremental in (("generation_ms", False, True), ("full_generation_ms", False, False),
                                          ("moves_only_ms", True, True)):
        settings = replace(settings, incremental=incremental)
        compile_s, seconds, _ = timed_block(alignment, model, priors, settings, settings.tune_generations, prior_only)
        out[name] = 1e3 * seconds / generations
        out[name.replace("_ms", "_first_call_s")] = compile_s
    posterior, state, _ = starting_state(alignment, model, settings, priors=priors)
    state = state.chains.position

    @jax.jit
    def likelihoods(state, posterior):
        def one(i, total):  # a different edge length every call: nothing to hoist out of the loop
            edge = state.edge * (1.0 + 1e-3 * i)
            return total + posterior.log_likelihoods(state.up, edge, state.root, state.params).sum()
        return jax.lax.fori_loop(0, generations, one, 0.0)

    jax.block_until_ready(likelihoods(state, posterior))
    began = time.perf_counter()
    jax.block_until_ready(likelihoods(state, posterior))
    out["likelihood_ms"] = 1e3 * (time.perf_counter() - began) / generations
    partials = 8 * (2 * len(alignment.taxa) - 1) * posterior.data.weights.shape[-1] * 4 * 8 * \
        getattr(posterior.coordinates.template.rate_variation, "num_categories", 1)
    out["likelihood_bytes"] = 2 * partials
    return out


def per_move(alignment, model, priors, generations: int, runs: int = 2) -> dict:
    """Milliseconds per generation (kept partials, all chains) with one move alone, for every move the defaults
    weight (for JC69 no parameter move: it has none); each is its own compiled block."""
    from jaxphylo.inference.mc3 import DEFAULT_MOVES

    out = {}
    for name, weight in DEFAULT_MOVES.items():
        if weight <= 0 or (name == "parameters" and model == "JC"):
            continue
        settings = MC3Settings(runs=runs, chains=4, generations=generations, sample_every=100,
                               block=max(1, generations // 100), moves={name: 1.0})
        _, seconds, _ = timed_block(alignment, model, priors, settings, settings.tune_generations)
        out[name] = 1e3 * seconds / generations
    return out


def fused(alignment, model, priors, steps: int, blocks, runs: int) -> dict:
    """ms per generation of NNI and branch multiplier with `K` more after each in one launch, for every `K` of
    `blocks` (0: one generation per launch); each its own compiled block of `steps` steps (first call apart)."""
    out = {}
    for k in blocks:
        settings = MC3Settings(runs=runs, chains=4, generations=steps, sample_every=10, block=max(1, steps // 10),
                               moves={"nni": 3.0, "branch_multiplier": 5.0}, fused_generations=k)
        first, seconds, state = timed_block(alignment, model, priors, settings, 0)
        chains = state.chains
        out[k] = {"ms_per_generation": 1e3 * seconds / (steps * (1 + k)), "first_call_s": first,
                  "acceptance": float(chains.accepted.sum() / chains.proposed.sum())}
    return out


def ours_to_stop(alignment, model, priors, max_generations: int, block: int, seed: int, fused_generations: int = 0
                 ) -> dict:
    settings = MC3Settings(runs=2, chains=4, generations=max_generations, sample_every=100, stop_asdsf=0.01,
                           block=block, fused_generations=fused_generations)
    began = time.perf_counter()
    result = jp.inference.mc3(alignment, model, settings=settings, priors=priors, seed=seed)
    wall = time.perf_counter() - began
    moves = result.generations * (1 + fused_generations)
    return {"generations": moves, "steps": result.generations, "fused_generations": fused_generations,
            "wall_seconds": wall,
            "final_asdsf": result.asdsf, "stopped_by_rule": result.asdsf < 0.01, "generations_per_second": moves / wall}


def mrbayes_to_stop(case: str, max_generations: int, seed: int) -> dict | None:
    if shutil.which("mb") is None:
        return None
    import mrbayes_reference as mb

    part = {"DS1": "ds1_stoprule", "carnivores": "carnivores_fixed"}[case]
    with tempfile.TemporaryDirectory() as tmp:
        _, record = mb.run_part(part, seed, "beagle", max_generations, Path(tmp), data_root=SHARED_DATA,
                                results=Path(tmp), golden=False, stoprule=True)
    return {k: record[k] for k in ("generations", "wall_seconds", "final_asdsf", "stopped_by_rule",
                                   "generations_per_second", "mrbayes_version")}


def hmc_mixing(alignment, model, priors, generations: int, seed: int, weight: float) -> dict:
    """What the HMC move does to mixing: ESS per second (and per generation) of every continuous column, with
    HMC drawn at `weight` (beside the default moves' total of 21) or not at all; same seed and generations."""
    out = {}
    for label, w in (("without_hmc", 0.0), ("with_hmc", weight)):
        moves = dict(jp.inference.MC3Settings().moves, hmc=w)
        settings = MC3Settings(runs=2, chains=4, generations=generations, sample_every=20, block=50, moves=moves)
        began = time.perf_counter()
        result = jp.inference.mc3(alignment, model, settings=settings, priors=priors, seed=seed)
        wall = time.perf_counter() - began
        ess = {row["name"]: row["ess"] for row in result.convergence() if row["name"] != "LnPr"}
        out[label] = {"seconds": wall, "ess": ess, "min_ess": min(ess.values()), "asdsf": result.asdsf,
                      "min_ess_per_second": min(ess.values()) / wall, "acceptance": result.acceptance,
                      "tree_length_ess_per_second": ess["TL"] / wall}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--max-generations", type=int, nargs="+", default=[1_000_000, 100_000])
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--breakdown-runs", type=int, nargs="+", default=[2],
                        help="runs (x 4 chains) of the per-generation breakdown; several: one row each")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-mrbayes", action="store_true")
    parser.add_argument("--no-run", action="store_true", help="no runs to the stop rule")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--per-move", type=int, nargs="*", default=None, metavar="GENERATIONS",
                        help="also ms per generation with each move alone (GENERATIONS per case, default 1000)")
    parser.add_argument("--fused", type=int, nargs="*", default=None, metavar="K",
                        help="also ms per NNI/branch-multiplier generation with K more per launch, e.g. 0 10 50")
    parser.add_argument("--fused-runs", type=int, nargs="+", default=[2])
    parser.add_argument("--fused-steps", type=int, default=200)
    parser.add_argument("--run-fused", type=int, default=0,
                        help="the runs to the stop rule with this many fused generations after each generation")
    parser.add_argument("--hmc", nargs=2, metavar=("CASE", "GENERATIONS"), default=None,
                        help="also measure the HMC move's effect on mixing on CASE (HKY+FO+G4), e.g. primates_mtDNA 20000")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    record = device_record("mc3")
    record.update(cpu_count=os.cpu_count(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                  update_backend=jp.likelihood.kernels.update_backend(4))
    lines = [f"{'case':<11}{'program':<10}{'gens':>9}{'wall s':>9}{'gens/s':>9}{'ASDSF':>8}  ratio (MrBayes s / ours s)"]
    for case, max_generations in zip(args.cases, args.max_generations * len(args.cases)):
        ours_model, _ = CASES[case]
        alignment = jp.read_alignment(SHARED_DATA / case / "alignment.fasta")
        priors = {k: v() for k, v in MRBAYES_PRIORS.items()} if "HKY" in ours_model else None
        row = {"case": case, "taxa": len(alignment.taxa), "sites": alignment.num_sites, "model": ours_model}
        if not args.no_breakdown:
            row["breakdowns"] = {runs: breakdown(alignment, ours_model, priors, runs=runs) for runs in args.breakdown_runs}
            row["breakdown"] = row["breakdowns"][args.breakdown_runs[0]]
            for runs, b in row["breakdowns"].items():
                print(case, runs, "runs", {k: round(v, 4) for k, v in b.items()}, flush=True)
        if args.per_move is not None:
            counts = args.per_move or [1000]
            row["per_move_ms"] = per_move(alignment, ours_model, priors, counts[min(args.cases.index(case),
                                                                                len(counts) - 1)])
            print(case, "per move, ms per generation:", {k: round(v, 4) for k, v in row["per_move_ms"].items()},
                  flush=True)
            lines.append(f"{case:<11}per move alone, ms per generation: "
                         + ", ".join(f"{k} {v:.3f}" for k, v in row["per_move_ms"].items()))
        if args.fused is not None:
            blocks = args.fused or [0, 10, 50]
            row["fused"] = {runs: fused(alignment, ours_model, priors, args.fused_steps, blocks, runs)
                            for runs in args.fused_runs}
            for runs, by_k in row["fused"].items():
                lines.append(f"{case:<11}{runs} runs x 4 chains, ms per NNI/multiplier generation: "
                             + ", ".join(f"K={k} {r['ms_per_generation']:.4f} (acc {r['acceptance']:.2f}, first"
                                         f" {r['first_call_s']:.1f} s)" for k, r in by_k.items()))
                print(lines[-1], flush=True)
        if not args.no_run:
            row["jaxphylo"] = ours_to_stop(alignment, ours_model, priors, max_generations, args.block, args.seed,
                                           args.run_fused)
            row["mrbayes"] = None if args.no_mrbayes else mrbayes_to_stop(case, max_generations, args.seed)
            for program in ("jaxphylo", "mrbayes"):
                r = row[program]
                if r is None:
                    continue
                ratio = (f"{row['mrbayes']['wall_seconds'] / row['jaxphylo']['wall_seconds']:.2f}"
                         if program == "jaxphylo" and row["mrbayes"] else "")
                lines.append(f"{case:<11}{program:<10}{r['generations']:>9}{r['wall_seconds']:>9.1f}"
                             f"{r['generations_per_second']:>9.0f}{r['final_asdsf']:>8.4f}  {ratio}")
                print(lines[-1], flush=True)
        for runs, b in row.get("breakdowns", {}).items():
            lines.append(f"{case:<11}{runs} runs x 4 chains, per generation: {b['generation_ms']:.3f} ms kept partials"
                         f" ({1e3 / b['generation_ms']:.0f} gen/s), {b['full_generation_ms']:.3f} ms every node"
                         f" (ratio {b['full_generation_ms'] / b['generation_ms']:.2f}); moves alone"
                         f" {b['moves_only_ms']:.3f}, batched likelihood alone {b['likelihood_ms']:.3f}; first block"
                         f" {b['generation_first_call_s']:.1f} s")
        record["rows"].append(row)
        save(record, args.out, "mc3")  # after every case: a run cut short keeps what it measured
    if args.hmc:
        case, generations = args.hmc[0], int(args.hmc[1])
        alignment = jp.read_alignment(SHARED_DATA / case / "alignment.fasta")
        priors = {k: v() for k, v in MRBAYES_PRIORS.items()}
        record["hmc_mixing"] = {"case": case, "model": "HKY+FO+G4", "generations": generations,
                                **hmc_mixing(alignment, "HKY+FO+G4", priors, generations, args.seed, 2.0)}
        for label in ("without_hmc", "with_hmc"):
            r = record["hmc_mixing"][label]
            lines.append(f"{case:<11}{label:<12} {generations} generations {r['seconds']:.1f} s: min ESS {r['min_ess']:.0f}"
                         f" ({r['min_ess_per_second']:.2f}/s), tree length ESS/s {r['tree_length_ess_per_second']:.2f},"
                         f" ASDSF {r['asdsf']:.4f}")
    text = "\n".join(lines)
    print("\n" + text)
    save(record, args.out, "mc3")
    (Path(args.out) / f"mc3-{record['platform']}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
