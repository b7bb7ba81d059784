"""Runs across processes (`jax.distributed`): joining them, and writing every output once.

`jaxphylo --distributed COMMAND ...` runs one process per host (or per GPU)
under `jax.distributed.initialize()`: on Slurm and Open MPI it finds the
others by itself; elsewhere `JAXPHYLO_COORDINATOR=host:port`,
`JAXPHYLO_NUM_PROCESSES` and `JAXPHYLO_PROCESS_ID` say where and who. The
device mesh then spans every process's devices and every process runs the
same program on its own devices (SPMD), so every process computes the same
outputs. Process 0 writes them where asked; every other process writes its
copies into a private temporary folder (`mirror_outputs`), which it first
fills with what is already there (a resumed run reads the checkpoints that
process 0 saved), and prints nothing but errors.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .._errors import InputError

ENVIRONMENT = ("JAXPHYLO_COORDINATOR", "JAXPHYLO_NUM_PROCESSES", "JAXPHYLO_PROCESS_ID")


def join_processes() -> None:
    """`jax.distributed.initialize()`, with the coordinator, process count and index from the environment
    when `JAXPHYLO_COORDINATOR` is set (else JAX's own detection: Slurm, Open MPI)."""
    import jax

    given = {name: os.environ.get(name) for name in ENVIRONMENT}
    where = {}
    if given["JAXPHYLO_COORDINATOR"] is not None:
        try:
            where = {"coordinator_address": given["JAXPHYLO_COORDINATOR"],
                     "num_processes": int(given["JAXPHYLO_NUM_PROCESSES"]),
                     "process_id": int(given["JAXPHYLO_PROCESS_ID"])}
        except (TypeError, ValueError):
            raise InputError("JAXPHYLO_COORDINATOR needs JAXPHYLO_NUM_PROCESSES and JAXPHYLO_PROCESS_ID "
                             "(whole numbers) beside it") from None
    try:
        jax.distributed.initialize(**where)
    except (ValueError, RuntimeError) as err:  # no cluster found, or the coordinator cannot be reached
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--distributed: {first} (outside Slurm and Open MPI set JAXPHYLO_COORDINATOR=host:port, "
                         f"JAXPHYLO_NUM_PROCESSES and JAXPHYLO_PROCESS_ID)") from None


def output_target(args) -> str | None:
    """What a command writes to: its `--out` (a folder or a prefix), or for `ml`/`models` without one the
    alignment's name (their default prefix)."""
    out = getattr(args, "out", None)
    if out is None and getattr(args, "command", None) in ("ml", "models"):
        out = getattr(args, "alignment", None)
    return out


def mirror_outputs(args, index: int) -> None:
    """On process `index > 0`: point the command's outputs at a private copy and silence stdout/stderr."""
    target = output_target(args)
    if target is not None:
        private = Path(tempfile.mkdtemp(prefix=f"jaxphylo-process{index}-"))
        source = Path(target)
        if source.is_dir():
            shutil.copytree(source, private / source.name)
        else:
            for path in source.parent.glob(source.name + ".*"):  # a prefix's files (PREFIX.ckpt, PREFIX.log, ...)
                if path.is_file():
                    shutil.copy2(path, private / path.name)
        args.out = str(private / source.name)
    quiet = open(os.devnull, "w")
    sys.stdout.flush()
    os.dup2(quiet.fileno(), 1)  # libraries that print to the descriptor (gloo) too
    sys.stdout = sys.stderr = quiet  # progress; errors still reach the real stderr (`cli.main` holds it)
