"""The `jaxphylo` command: one module per command (`add_command(commands)` adds its parser, `run(args)` runs
it), the options several share in `_common.py`. `main` catches what every command shares: stop requests
(signals, --max-time), bad input (one line, exit 2), running out of device memory.

Commands import JAX and the library inside `run`, so that `jaxphylo --help` and a bad option answer at once.
A new command is a module beside these (copy `_distance.py`) and one line in `build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

from .._errors import JaxphyloError
from ..runtime import EXIT_INTERRUPTED, NEVER, Interrupted, StopRequests, parse_duration
from . import _cache, _coevolution, _distance, _env, _loglik, _mcmc, _ml, _models, _nj, _sample, _vi


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxphylo", description="Differentiable phylogenetics in JAX.")
    parser.add_argument("--distributed", action="store_true",
                        help="one of several processes (jax.distributed: Slurm, Open MPI, or JAXPHYLO_COORDINATOR, "
                             "JAXPHYLO_NUM_PROCESSES, JAXPHYLO_PROCESS_ID); process 0 writes the outputs")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (_loglik, _sample, _ml, _distance, _nj, _coevolution, _models, _mcmc, _vi, _env, _cache):
        command.add_command(commands)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    errors = sys.stderr  # errors reach the user from every process; outputs come from process 0 only
    try:
        if args.distributed:
            import jax

            from ..runtime import join_processes, mirror_outputs

            join_processes()
            if jax.process_index() > 0:
                mirror_outputs(args, jax.process_index())
        # Signals are caught from the start, so a kill announced during start-up or compilation
        # is answered at the first iteration, saved, instead of losing the process.
        long_run = hasattr(args, "max_time")
        # Run as the program (argv None: the process's own command line, which ends when this returns), a
        # finished run ignores a stop that arrives while the process exits; called from Python, nothing changes.
        stops = StopRequests(parse_duration(args.max_time), ignore_after=argv is None) if long_run else \
            nullcontext(NEVER)
        with stops as args.stop:
            args.run(args)
    except Interrupted as err:
        print(f"jaxphylo: stopped: {err}", file=errors)
        return EXIT_INTERRUPTED
    except JaxphyloError as err:
        print(f"jaxphylo: error: {err}", file=errors)
        return 2
    except KeyboardInterrupt:
        print("jaxphylo: interrupted", file=errors)
        return 130
    except Exception as err:  # XLA's out-of-memory error becomes one line; anything else is a bug: traceback
        from ..runtime import out_of_memory_message

        if (message := out_of_memory_message(err)) is None:
            raise
        print(f"jaxphylo: error: {message}", file=errors)
        return 2
    return 0
