"""`jaxphylo sample`: Bayesian inference, NUTS on a fixed topology, or a time tree with the topology
sampled (`--topology free`).

With `--topology free` The run has `(--warmup + --samples) x --sample-every` generations per chain;
the first `--warmup` samples' generations tune the moves and are left out of
the summary and the MCC tree (they stay in the logs, as BEAST's do)."""

from __future__ import annotations

import sys

from .._errors import JaxphyloError
from ._common import (
    SAMPLE_MODEL, add_data_options, add_mesh_options, add_partition_options, digest, example_paths, mesh_choice,
    model_or_partitions, partition_choice, require_part_models,
)

FREE_TREE_PRIORS = ("coalescent", "exponential", "skygrid", "yule", "birth-death")  # the last two: contemporaneous tips


def add_command(commands) -> None:
    sample = commands.add_parser("sample", help="Bayesian inference: NUTS on a fixed topology, or a time tree with "
                                                "the topology sampled (--topology free)")
    sample.add_argument("alignment", nargs="?", help="FASTA, PHYLIP or NEXUS alignment")
    sample.add_argument("tree", nargs="?", help="Newick or NEXUS tree: the fixed topology and the starting values "
                                                "(with --topology free: the start)")
    sample.add_argument("--model", "-m", help=f"model string (default {SAMPLE_MODEL}); values in braces are fixed. "
                                               "With -p/-q/-Q: the model of the parts that name none (no default)")
    sample.add_argument("--clock", choices=("strict", "relaxed"), default=None,
                        help="a rooted time tree with this clock (default: unrooted tree, free branch lengths)")
    sample.add_argument("--dates", help="TSV: taxon<TAB>date, or a header naming date or lower/upper; decimal years "
                                        "(1999.5), ISO dates (2004-07-12), months (2004-07) or years (2004) as "
                                        "intervals (sampled); NA to estimate (needs --clock)")
    sample.add_argument("--dates-in-names", action="store_true", help="dates at the end of taxon names, e.g. A_1999.5")
    sample.add_argument("--tree-prior", help="unrooted: exponential (default), gamma-dirichlet; "
                                             "time tree: coalescent (default), exponential (exponential-growth "
                                             "coalescent), skygrid, yule, birth-death "
                                             "(the last two for contemporaneous tips)")
    sample.add_argument("--branch-rate", type=float, default=10.0, help="rate of the exponential branch-length prior")
    sample.add_argument("--priors", choices=("default", "mrbayes"), default="default",
                        help="substitution-parameter priors (mrbayes: kappa/(1+kappa) ~ Beta(1,1))")
    sample.add_argument("--chains", type=int, default=None,
                        help="NUTS chains (default: 4 on a CPU, one per core; on a GPU 4-64 vectorized, as many as "
                             "the alignment's size lets run at nearly the cost of one); --topology free: independent "
                             "runs (default 4)")
    sample.add_argument("--warmup", type=int, default=500)
    sample.add_argument("--samples", type=int, default=1000, help="draws per chain after warmup")
    sample.add_argument("--block", type=int, default=100, help="draws per chain between checkpoints")
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--out", "-o", default="jaxphylo-run", help="output directory (default jaxphylo-run)")
    sample.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    sample.add_argument("--dry-run", action="store_true",
                        help="print the data sizes, memory per device and the time of one evaluation; then exit")
    sample.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h, 90m, 36:00:00); "
                                           "SIGTERM, SIGINT and SIGUSR1 do the same")
    add_data_options(sample)
    sample.add_argument("--no-progress", action="store_true", help="no progress bars")
    sample.add_argument("--example", action="store_true", help="the built-in example (16 taxa, 600 sites)")
    _add_free_topology_options(sample)
    add_partition_options(sample, "partitions with unlinked branch lengths (each part its own; no --clock)")
    add_mesh_options(sample, "none: the chains run in parallel, one per device, or vectorized on one; with "
                             "--mesh or --devices the patterns are split over the devices instead")
    sample.set_defaults(run=run)


def run(args) -> None:
    import dataclasses
    import os

    from jaxphylo.inference.nuts import CPU_CHAINS  # importing starts no JAX backend

    cpu_chains = args.chains or CPU_CHAINS
    if cpu_chains > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        import numpyro  # before JAX starts its CPU backend: one CPU device per chain

        numpyro.set_host_device_count(min(cpu_chains, os.cpu_count() or 1))
    import jaxphylo as jp
    from jaxphylo.inference import Analysis, chunk_program, prepare, progress_printer, run_nuts, write_outputs
    from jaxphylo.inference.nuts import default_chains
    from jaxphylo.likelihood import check_start, partials_cells, plan
    from jaxphylo.likelihood import place_data

    if not args.example and not args.alignment:
        raise JaxphyloError("sample needs ALIGNMENT [TREE] (or --example)")
    if _wants_free_topology(args):
        _run_free_topology(args)
        return
    free_only = (("--heats", args.heats != 1), ("--move-weights", args.move_weights))
    if given := [name for name, value in free_only if value]:
        raise JaxphyloError(f"{given[0]} is an option of --topology free; NUTS on a fixed topology has no moves "
                            f"or heats")
    if args.example:
        alignment_path, tree_path = example_paths()
    else:
        alignment_path, tree_path = args.alignment, args.tree
    partitions, link = partition_choice(args) or (None, "proportional")
    model_string = model_or_partitions(args, "sample", None if partitions else SAMPLE_MODEL)
    if partitions:
        require_part_models(jp.read_partitions(partitions), model_string)
    _check_tree_prior_options(args, (args.tree_prior or "coalescent") if args.clock else None)
    analysis = Analysis(model=model_string, clock=args.clock, tree_prior=args.tree_prior,
                        branch_rate=args.branch_rate, priors=args.priors, precision=args.precision,
                        partitions=partitions, link=link, skygrid_intervals=args.skygrid_intervals,
                        skygrid_cutoff=args.skygrid_cutoff, skygrid_precision=args.skygrid_precision,
                        growth_rate_scale=args.growth_rate_scale)
    alignment = jp.read_alignment(alignment_path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(tree_path)
    tip_dates, dates_digest = None, None
    if args.dates or args.dates_in_names:
        if not args.clock:
            raise JaxphyloError("tip dates need a clock: add --clock strict or --clock relaxed")
        tip_dates = jp.io.read_tip_dates(args.dates) if args.dates else jp.io.tip_dates_from_names(tree.taxa)
        dates_digest = tip_dates.digest()
    prepared = prepare(alignment, tree, analysis, tip_dates)
    mesh = mesh_choice(args, 1, alignment.site_patterns().num_patterns, default=False)
    if mesh is not None and mesh.shape["batch"] > 1:
        raise JaxphyloError(f"sample splits the patterns over devices (--mesh patterns=N), not its chains: "
                            f"batch={mesh.shape['batch']} would repeat the same work")
    if mesh is not None:  # the patterns over the devices; the chains vectorized (pmap would split them instead)
        prepared = dataclasses.replace(prepared, data=place_data(prepared.data, mesh))
        print(f"# devices: mesh batch={mesh.shape['batch']} x patterns={mesh.shape['patterns']}", file=sys.stderr)
    model = prepared.substitution
    args.chains = args.chains or default_chains(partials_cells(prepared.data, prepared.tree, model))
    plan(prepared.data, prepared.tree, model, args.precision,
         args.chains, args.dry_run, alignment.num_sites, log=lambda text: print(text, file=sys.stderr),
         program=chunk_program(prepared.model, prepared.data, prepared.init, args.chains, args.warmup))
    if args.dry_run:
        return
    settings = {"alignment": digest(alignment_path), "tree": digest(tree_path), "dates": dates_digest,
                "analysis": analysis.as_dict(), "partitions": partitions and digest(partitions)}
    log = progress_printer()
    start_check = lambda: check_start(prepared.data, prepared.tree, model, args.precision)  # noqa: E731
    draws = run_nuts(prepared.model, prepared.data, prepared.init, args.out, settings=settings,
                     chains=args.chains, warmup=args.warmup, samples=args.samples, block=args.block,
                     seed=args.seed, resume=args.resume, progress=not args.no_progress, log=log, stop=args.stop,
                     check_start=start_check, method="vectorized" if (args.mesh or args.devices) else None)
    text = write_outputs(args.out, draws, prepared.tree.topology, prepared.time)
    print(text)
    divergent = int(draws.stats["diverging"].sum())
    log(f"# {divergent} divergent transitions of {draws.stats['diverging'].size} (non-finite or diverging "
        f"proposals: rejected, the chain stayed put)")
    log(f"# {args.out}: posterior.nc (ArviZ), chain*.log (Tracer), chain*.trees (NEXUS), summary.tsv, summary.png")


def _add_free_topology_options(sample) -> None:
    sample.add_argument("--topology", choices=("fixed", "free"), default=None,
                        help="fixed: the tree given (default when one is given); free: sampled with BEAST's tree "
                             "moves and HMC (default without a tree; needs --clock)")
    sample.add_argument("--sample-every", type=int, default=100,
                        help="--topology free: generations between samples (default 100)")
    sample.add_argument("--move-weights", default=None, metavar="NAME=W,...",
                        help="--topology free: weights changed from the defaults (narrow_exchange 30, wide_exchange "
                             "6, subtree_slide 30, wilson_balding 6, node_height 15, root_height 3, hmc 3), e.g. "
                             "hmc=6,wide_exchange=0")
    sample.add_argument("--heats", type=int, default=1,
                        help="--topology free: chains per --chains run, heated as MrBayes's (beta_k = 1/(1 + T k)); "
                             "each run's cold chain is sampled (default 1: no heating)")
    sample.add_argument("--temperature", type=float, default=0.1, help="--topology free: T of --heats (default 0.1)")
    sample.add_argument("--skygrid-intervals", type=int, default=10, help="skygrid: population sizes (default 10)")
    sample.add_argument("--skygrid-cutoff", type=float, default=None,
                        help="skygrid: time of the last grid point (default 1.2 x the start tree's root height)")
    sample.add_argument("--skygrid-precision", type=float, default=None,
                        help="skygrid: fix the smoothing precision of the log sizes' random walk at this value "
                             "(default: sampled, Gamma(0.001, 0.001) prior)")
    sample.add_argument("--growth-rate-scale", type=float, default=1.0,
                        help="exponential: scale of the Laplace(0, scale) prior on the growth rate, per time unit "
                             "(default 1, BEAST's)")


def _check_tree_prior_options(args, prior: str | None) -> None:
    """`--skygrid-precision` needs the skygrid and is positive; so is `--growth-rate-scale` (`prior`: the time
    tree's prior, None for an unrooted tree)."""
    if args.skygrid_precision is not None:
        if prior != "skygrid":
            raise JaxphyloError(f"--skygrid-precision fixes the skygrid's precision, but the tree prior is "
                                f"{prior or 'an unrooted branch-length prior'}: add --clock and --tree-prior skygrid")
        if not args.skygrid_precision > 0:
            raise JaxphyloError(f"--skygrid-precision must be positive, got {args.skygrid_precision:g}")
    if not args.growth_rate_scale > 0:
        raise JaxphyloError(f"--growth-rate-scale must be positive, got {args.growth_rate_scale:g}")


def _wants_free_topology(args) -> bool:
    if args.topology == "free" or (args.topology is None and not args.tree and not args.example):
        if not args.clock:
            raise JaxphyloError("a sampled topology is a time tree: add --clock strict or --clock relaxed "
                                "(and --dates for dated tips)")
        return True
    if args.topology == "fixed" and not args.tree and not args.example:
        raise JaxphyloError("--topology fixed needs a TREE")
    return False


def _run_free_topology(args) -> None:
    import jaxphylo as jp
    from jaxphylo.inference import DatedSettings, check_dated_inputs, dated_mcmc
    from jaxphylo.inference.base import changed_weights

    if args.p or args.q or args.Q:
        raise JaxphyloError("--topology free takes one model for the whole alignment (no -p/-q/-Q yet)")
    prior = args.tree_prior or "coalescent"
    if prior not in FREE_TREE_PRIORS:
        raise JaxphyloError(f"--topology free: the tree prior is one of {', '.join(FREE_TREE_PRIORS)}, not {prior!r}")
    _check_tree_prior_options(args, prior)
    path = jp.example_paths()[0] if args.example else args.alignment
    alignment = jp.read_alignment(path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(args.tree) if args.tree else None
    tip_dates = None
    if args.dates or args.dates_in_names:
        tip_dates = jp.io.read_tip_dates(args.dates) if args.dates else jp.io.tip_dates_from_names(alignment.taxa)
    check_dated_inputs(alignment, tip_dates, prior)  # before a dry run too
    settings = DatedSettings(chains=args.chains or 4, heats=args.heats, temperature=args.temperature,
                             generations=(args.warmup + args.samples) * args.sample_every,
                             sample_every=args.sample_every, tune=args.warmup * args.sample_every,
                             block=args.block, moves=changed_weights(DatedSettings().moves, args.move_weights))
    burnin = args.warmup / (args.warmup + args.samples)

    def progress(generation, log_posterior):
        if not args.no_progress:
            best = ", ".join(f"{x:.2f}" for x in log_posterior)
            print(f"# generation {generation}: log posterior {best}", file=sys.stderr, flush=True)

    if args.dry_run:
        print(f"# {len(alignment.taxa)} taxa, {alignment.site_patterns().num_patterns} patterns; "
              f"{settings.chains} chains x {settings.heats} heats x {settings.generations} generations",
              file=sys.stderr)
        return
    result = dated_mcmc(alignment, args.model or SAMPLE_MODEL, tip_dates, clock=args.clock, tree_prior=prior,
                        tree=tree, settings=settings, skygrid_intervals=args.skygrid_intervals,
                        skygrid_cutoff=args.skygrid_cutoff, skygrid_precision=args.skygrid_precision,
                        growth_rate_scale=args.growth_rate_scale, seed=args.seed, precision=args.precision, out=args.out,
                        resume=args.resume, progress=progress, stop=args.stop, burnin=burnin)
    rows = result.summary()
    print(f"{'parameter':<24}{'median':>14}{'95% HPD':>32}{'ESS':>9}")
    for row in rows:
        low, high = row["hpd_95"]
        print(f"{row['name']:<24}{row['median']:>14.6g}{f'[{low:.6g}, {high:.6g}]':>32}{row['ess']:>9.0f}")
    moves = ", ".join(f"{name} {rate:.2f}" for name, rate in result.acceptance.items())
    print(f"# acceptance: {moves}", file=sys.stderr)
    print(f"# {args.out}: chain*.log (Tracer), chain*.trees (NEXUS time trees), mcc.tree (FigTree), summary.json",
          file=sys.stderr)
