"""`jaxphylo mcmc ALIGNMENT -m MODEL`: Metropolis-coupled MCMC over trees (MrBayes's MC³) from the command line.

Wired into `jaxphylo.cli.build_parser` by `add_mcmc_command(commands)`. A long
command: SIGTERM, SIGINT, SIGUSR1 or `--max-time` stop it after the current
block, saved (exit 75); `--resume` continues it to the bytes of a run that
never stopped.
"""

from __future__ import annotations

import sys

from ._common import (
    add_data_options, add_mesh_options, add_partition_options, mesh_choice, model_or_partitions, partition_choice,
    partitioned_model_of,
)


def add_command(subparsers) -> None:
    mcmc = subparsers.add_parser("mcmc", help="Bayesian tree inference: Metropolis-coupled MCMC (MrBayes's MC³)")
    mcmc.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment")
    mcmc.add_argument("--model", "-m", help="substitution model, e.g. JC, HKY+G4, GTR+I+G4; with -p/-q/-Q: the model "
                                            "of the parts that name none (not needed when all do)")
    mcmc.add_argument("--runs", type=int, default=2, help="independent runs (default 2)")
    mcmc.add_argument("--chains", type=int, default=4, help="chains per run, one cold (default 4)")
    mcmc.add_argument("--generations", type=int, default=100_000, help="generations per chain at most")
    mcmc.add_argument("--sample-every", type=int, default=100, help="sample the cold chains every K generations")
    mcmc.add_argument("--temperature", type=float, default=0.1, help="heating: beta_i = 1/(1 + T i) (default 0.1)")
    mcmc.add_argument("--stop-asdsf", type=float, default=None,
                      help="stop when ASDSF (25%% burn-in, splits >= 0.1) falls below this, e.g. 0.01")
    mcmc.add_argument("--branch-rate", type=float, default=10.0,
                      help="edge lengths ~ Exponential(rate) (default 10, MrBayes's)")
    mcmc.add_argument("--priors", choices=("default", "mrbayes"), default="default",
                      help="substitution-parameter priors (mrbayes: kappa/(1+kappa) ~ Beta(1,1)), as for sample")
    mcmc.add_argument("--hmc", type=float, default=0.0,
                      help="weight of the HMC move over all edge lengths and parameters (default 0: off; the other "
                           "moves weigh 21 together)")
    mcmc.add_argument("--fused-generations", type=int, default=0, metavar="K",
                      help="after every generation, K more per chain, each an NNI or a branch multiplier (by their "
                           "weights); on a GPU, for nucleotide data of up to 2,048 pattern-categories, in one launch "
                           "(tgMC³'s fused kernel), else one at a time. Default 0")
    mcmc.add_argument("--block", type=int, default=50, help="samples per device call (a checkpoint after each)")
    mcmc.add_argument("--seed", type=int, default=0)
    mcmc.add_argument("--out", "-o", default="mcmc", help="output folder (default ./mcmc)")
    mcmc.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    add_data_options(mcmc)
    mcmc.add_argument("--dry-run", action="store_true",
                      help="print the data sizes, memory per device and the time of one evaluation; then exit")
    mcmc.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h); SIGTERM, SIGINT, SIGUSR1 too")

    add_partition_options(mcmc, "unlinked branch lengths (each part its own, Exponential prior on each; the trees "
                                "carry their site-weighted mean, the log every part's tree length TL.PART)")
    add_mesh_options(mcmc, "every visible device, whole runs per device where the runs divide evenly")
    mcmc.set_defaults(run=run)


def run(args) -> None:
    import jaxphylo as jp
    from jaxphylo.inference import DEFAULT_MOVES, PRIOR_SETS, MC3Settings, mc3


    model_string = model_or_partitions(args, "mcmc")
    alignment = jp.read_alignment(args.alignment, data_type=args.data_type, genetic_code=args.genetic_code)
    partitions = partition_choice(args)
    model = partitioned_model_of(args, alignment, model_string) if partitions else model_string
    jp.ml.check_inputs(alignment, model)
    settings = MC3Settings(runs=args.runs, chains=args.chains, generations=args.generations,
                           sample_every=args.sample_every, temperature=args.temperature, stop_asdsf=args.stop_asdsf,
                           block=args.block, branch_rate=args.branch_rate, moves=dict(DEFAULT_MOVES, hmc=args.hmc),
                           fused_generations=args.fused_generations)
    _plan(alignment, model, args, settings.runs * settings.chains)  # every chain's tree is evaluated at once
    if args.dry_run:
        return

    def progress(generation, cold, value):
        lnl = "  ".join(f"{x:.2f}" for x in cold)
        print(f"generation {generation}\tcold log L {lnl}\tASDSF {value:.4f}", file=sys.stderr, flush=True)

    mesh = mesh_choice(args, settings.runs, alignment.site_patterns().num_patterns)
    if mesh is not None:
        print(f"# devices: mesh batch={mesh.shape['batch']} x patterns={mesh.shape['patterns']}", file=sys.stderr)
    result = mc3(alignment, model, settings=settings, seed=args.seed, priors=PRIOR_SETS[args.priors] or None,
                 precision=args.precision, out=args.out,
                 resume=args.resume, progress=progress, stop=args.stop, mesh=mesh)
    print(summary_text(result))


def _plan(alignment, model, args, batch: int) -> None:
    """`--dry-run`'s report, or a stop before starting when the chains' trees cannot fit in memory."""
    import jaxphylo as jp
    from jaxphylo.likelihood import plan
    from jaxphylo.likelihood import pattern_data

    tree = jp.random_topology_tree(alignment.taxa, seed=args.seed)
    model, _ = jp.models.resolve_model(model, alignment)
    data = jp.likelihood.partitioned_data(alignment, tree, model) if isinstance(model, jp.PartitionedModel) else \
        pattern_data(alignment, tree)
    plan(data, tree, model, args.precision, batch, args.dry_run, alignment.num_sites,
         log=lambda text: print(text, file=sys.stderr))


def summary_text(result) -> str:
    """ASDSF, PSRF and ESS of the continuous columns, acceptance and swap rates, generations per second."""
    lines = [f"# {result.generations} generations, {result.settings.runs} runs x {result.settings.chains} chains, "
             f"{result.generations / max(result.seconds, 1e-9):.0f} generations/s this session",
             f"# ASDSF {result.asdsf:.4f} (splits >= {result.settings.min_split_frequency}, "
             f"{result.settings.burnin:.0%} burn-in)",
             f"{'parameter':<24}{'mean':>14}{'PSRF':>8}{'ESS':>9}"]
    for row in result.convergence():
        lines.append(f"{row['name']:<24}{row['mean']:>14.6g}{row['psrf']:>8.3f}{row['ess']:>9.1f}")
    lines.append("# acceptance: " + ", ".join(f"{k} {v:.2f}" for k, v in result.acceptance.items()))
    rates = result.swap_rates.mean(0)
    pairs = [f"{i}<->{j} {rates[i, j]:.2f}" for i in range(rates.shape[0]) for j in range(i + 1, rates.shape[0])]
    if pairs:
        lines.append("# swap acceptance by heat pair (mean over runs): " + ", ".join(pairs))
    return "\n".join(lines)
