"""`jaxphylo sample ALN --clock C [--dates D] --topology free`: a time tree with the topology sampled (BEAST-style).

The run has `(--warmup + --samples) x --sample-every` generations per chain;
the first `--warmup` samples' generations tune the moves and are left out of
the summary and the MCC tree (they stay in the logs, as BEAST's do).
"""

from __future__ import annotations

import sys

from ._errors import JaxphyloError

FREE_TREE_PRIORS = ("coalescent", "skygrid", "yule", "birth-death")  # the last two: contemporaneous tips


def add_free_topology_options(sample) -> None:
    sample.add_argument("--topology", choices=("fixed", "free"), default=None,
                        help="fixed: the tree given (default when one is given); free: sampled with BEAST's tree "
                             "moves and HMC (default without a tree; needs --clock)")
    sample.add_argument("--sample-every", type=int, default=100,
                        help="--topology free: generations between samples (default 100)")
    sample.add_argument("--skygrid-intervals", type=int, default=10, help="skygrid: population sizes (default 10)")
    sample.add_argument("--skygrid-cutoff", type=float, default=None,
                        help="skygrid: time of the last grid point (default 1.2 x the start tree's root height)")


def wants_free_topology(args) -> bool:
    if args.topology == "free" or (args.topology is None and not args.tree and not args.example):
        if not args.clock:
            raise JaxphyloError("a sampled topology is a time tree: add --clock strict or --clock relaxed "
                                "(and --dates for dated tips)")
        return True
    if args.topology == "fixed" and not args.tree and not args.example:
        raise JaxphyloError("--topology fixed needs a TREE")
    return False


def run_free_topology(args) -> None:
    import jaxphylo as jp
    from jaxphylo.inference._dated_mcmc import DatedSettings
    from jaxphylo.inference._dated_run import _check_speciation_tips, _tip_heights, dated_mcmc

    from .cli import SAMPLE_MODEL

    if args.p or args.q or args.Q:
        raise JaxphyloError("--topology free takes one model for the whole alignment (no -p/-q/-Q yet)")
    prior = args.tree_prior or "coalescent"
    if prior not in FREE_TREE_PRIORS:
        raise JaxphyloError(f"--topology free: the tree prior is one of {', '.join(FREE_TREE_PRIORS)}, not {prior!r}")
    path = jp.example_paths()[0] if args.example else args.alignment
    alignment = jp.read_alignment(path, data_type=args.data_type, genetic_code=args.genetic_code)
    tree = jp.read_tree(args.tree) if args.tree else None
    tip_dates = None
    if args.dates or args.dates_in_names:
        tip_dates = jp.io.read_tip_dates(args.dates) if args.dates else jp.io.tip_dates_from_names(alignment.taxa)
    _check_speciation_tips(prior, _tip_heights(alignment, tip_dates)[1])  # before a dry run too
    settings = DatedSettings(chains=args.chains, generations=(args.warmup + args.samples) * args.sample_every,
                             sample_every=args.sample_every, tune=args.warmup * args.sample_every,
                             block=args.block)
    burnin = args.warmup / (args.warmup + args.samples)

    def progress(generation, log_posterior):
        if not args.no_progress:
            best = ", ".join(f"{x:.2f}" for x in log_posterior)
            print(f"# generation {generation}: log posterior {best}", file=sys.stderr, flush=True)

    if args.dry_run:
        print(f"# {len(alignment.taxa)} taxa, {alignment.site_patterns().num_patterns} patterns; "
              f"{settings.chains} chains x {settings.generations} generations", file=sys.stderr)
        return
    result = dated_mcmc(alignment, args.model or SAMPLE_MODEL, tip_dates, clock=args.clock, tree_prior=prior,
                        tree=tree, settings=settings, skygrid_intervals=args.skygrid_intervals,
                        skygrid_cutoff=args.skygrid_cutoff, seed=args.seed, precision=args.precision, out=args.out,
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
