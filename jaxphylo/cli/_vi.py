"""`jaxphylo vi ALIGNMENT -m MODEL`: variational Bayesian phylogenetics (ARTree's q(tree)) from the command line.

A long command: SIGTERM, SIGINT, SIGUSR1 or `--max-time` stop it after the
current block, saved (exit 75); `--resume` continues it to the bytes of a run
that never stopped.
"""

from __future__ import annotations

import sys

from ._common import add_data_options


def add_command(subparsers) -> None:
    vi = subparsers.add_parser("vi", help="variational Bayesian tree inference (ARTree-style q, no candidate "
                                          "trees)")
    vi.add_argument("alignment", help="FASTA, PHYLIP or NEXUS alignment")
    vi.add_argument("--model", "-m", required=True, help="substitution model, parameters fixed at the string's values "
                                                         "(e.g. JC, the benchmark's)")
    vi.add_argument("--steps", type=int, default=20_000, help="Adam steps (default 20000)")
    vi.add_argument("--particles", "-K", type=int, default=10, help="trees per step, scored in one batch (default 10)")
    vi.add_argument("--lr", type=float, default=1e-2,
                    help="Adam's learning rate for the lengths' network, cosine-decayed to 5%% (default 0.01)")
    vi.add_argument("--topology-rate", type=float, default=0.3,
                    help="the topology network's learning rate as a fraction of --lr (default 0.3)")
    vi.add_argument("--proximity", type=float, default=10.0,
                    help="starting weight of distance-guided insertion in q(tree) (default 10; 0: uniform start)")
    vi.add_argument("--explore", type=float, default=0.05,
                    help="draw the training trees with this share of uniform insertion per step (falling to 0 at half "
                         "the run) and train q(tree) by reweighted wake-sleep (default 0.05; 0: VIMCO)")
    vi.add_argument("--population", type=int,
                    help="q's trained side by side from different random starts, the best at the end kept (default 8 "
                         "on a GPU, 1 on a CPU)")
    vi.add_argument("--selections", type=int, default=0,
                    help="times, at tenths of the run, the population's worse half is replaced by copies of the "
                         "better half (default 0)")
    vi.add_argument("--anneal", type=int, default=0,
                    help="steps over which the likelihood's power rises from 0.001 to 1 (default 0: none)")
    vi.add_argument("--width", type=int, default=32, help="node features of the graph networks (default 32)")
    vi.add_argument("--branch-rate", type=float, default=10.0, help="edge lengths ~ Exponential(rate) (default 10)")
    vi.add_argument("--repeats", type=int, default=10, help="importance-sampling estimates of log ML (default 10)")
    vi.add_argument("--importance", type=int, default=1000, help="particles per estimate (default 1000)")
    vi.add_argument("--eval-batch", type=int, default=100, help="trees per likelihood call when estimating")
    vi.add_argument("--samples", type=int, default=1000, help="trees from q written to samples.trees (default 1000)")
    vi.add_argument("--block", type=int, default=100, help="steps per device call (a checkpoint after each)")
    vi.add_argument("--seed", type=int, default=0)
    vi.add_argument("--out", "-o", default="vi", help="output folder (default ./vi)")
    vi.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    vi.add_argument("--max-time", help="stop, saved, after this long (e.g. 23h); SIGTERM, SIGINT, SIGUSR1 too")
    add_data_options(vi)
    vi.set_defaults(run=run)


def run(args) -> None:
    import jaxphylo as jp
    from jaxphylo.inference.vi import VISettings, vi

    alignment = jp.read_alignment(args.alignment, data_type=args.data_type, genetic_code=args.genetic_code)
    settings = VISettings(steps=args.steps, particles=args.particles, learning_rate=args.lr,
                          topology_rate=args.topology_rate, anneal=args.anneal, proximity=args.proximity,
                          explore=args.explore, population=args.population, selections=args.selections,
                          width=args.width, block=args.block, branch_rate=args.branch_rate, repeats=args.repeats,
                          importance=args.importance, eval_batch=args.eval_batch, tree_samples=args.samples)

    def progress(step, bound, elbo):
        print(f"step {step}\t{settings.particles}-sample bound {bound:.2f}\tELBO estimate {elbo:.2f}", file=sys.stderr,
              flush=True)

    result = vi(alignment, args.model, settings, seed=args.seed, precision=args.precision, out=args.out,
                resume=args.resume, progress=progress, stop=args.stop)
    summary = result.summary()
    print(f"# {result.steps} steps, {result.seconds:.1f} s of training this session")
    if result.kept_step != result.steps:
        print(f"# q kept from step {result.kept_step}: the end of the block with the run's highest bound")
    print(f"log ML (importance sampling, {settings.importance} particles x {settings.repeats}): "
          f"{summary['log_ml_mean']:.3f} (sd {summary['log_ml_sd']:.3f})")
    print(f"ELBO: {summary['elbo_mean']:.3f} (sd {summary['elbo_sd']:.3f})")
    print(f"outputs in {args.out}: trace.tsv, trace.png, summary.json, splits.tsv, consensus.tree, samples.trees")
