"""One resumable run of blocks, whatever the blocks compute (numpyro's `MCMC` beside its kernels).

A run has a record (what its results depend on: data digest, model, seed, settings), an optional
checkpoint file, stop requests, and the output files it appends to as it goes. `BlockRun` owns what every
run loop repeats: the folder check (a new run does not overwrite a saved one; `--resume` needs one), the
checkpoint, read back only for the same record, the output files cut back to their lengths at the
checkpoint, so that a resumed run ends with the bytes of one that never stopped, and the stop points
between blocks. The caller's loop keeps only its own work: run a block, write its rows, report.

    run = BlockRun(folder / "checkpoint.pkl", record, files, stop)
    saved = run.open(resume)          # the saved payload, or None for a fresh start
    while not done:
        run.stop_point(payload, f"after {n} generations")
        ...                           # one block on the device, its rows to the files
        run.save(payload)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from .._errors import InputError
from ._checkpoint import NEVER, StopRequests, load_checkpoint, save_checkpoint, stop_point
from ._mesh import to_host


class BlockRun:
    """The checkpoint, record, stop requests and appended output files of one run (`checkpoint` None: a run
    kept in memory only, which can still be stopped)."""

    def __init__(self, checkpoint: Path | str | None, record: dict, files: Sequence[Path] = (),
                 stop: StopRequests = NEVER, occupied: str | None = None):
        """`occupied`: the error for a saved run found where a fresh one was asked for (default: a run folder's,
        naming `--resume` and `--out`); `open(None)` continues a saved run without asking."""
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.files, self.stop = list(files), stop
        self.record = {**record, "layout": "payload+sizes"}  # checkpoints of the earlier layout are refused
        self.occupied = occupied

    def check(self, resume: bool) -> None:
        """A fresh run must not overwrite a saved one, and a resumed run needs one."""
        if self.checkpoint is None:
            return
        if resume and not self.checkpoint.exists():
            raise InputError(f"{self.checkpoint}: nothing to resume")
        if not resume and self.checkpoint.exists():
            raise InputError(self.occupied or f"{self.checkpoint.parent} holds a run: continue it with --resume, "
                                              f"or choose another --out")

    def open(self, resume: bool | None):
        """The saved payload when resuming (output files cut back to where it was saved), else None (a fresh
        run: the caller writes the files' headers). `resume=None`: resume whatever is saved, if anything."""
        if self.checkpoint is None:
            return None
        if resume is None:
            resume = self.checkpoint.exists()
        self.check(resume)
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            return None
        saved = load_checkpoint(self.checkpoint, self.record)
        for path, size in zip(self.files, saved["sizes"]):
            with open(path, "r+b") as handle:
                handle.truncate(size)
        return saved["payload"]

    def save(self, payload: Callable[[], dict]) -> None:
        """Save `payload()` (host values) with the output files' lengths; a run without a checkpoint builds
        nothing (the payload copies the device state and every sample so far)."""
        if self.checkpoint is not None:
            sizes = [path.stat().st_size for path in self.files]
            save_checkpoint(self.checkpoint, {"payload": payload(), "sizes": sizes}, self.record)

    def stop_point(self, payload: Callable[[], dict], where: str) -> None:
        """Between blocks: on a stop request, save and raise `Interrupted` naming `where` the run stood."""
        stop_point(self.stop, lambda: self.save(payload), self.checkpoint, where)


def block_size(done: int, total: int, block: int) -> int:
    """The samples of a run's next block: 1, 1, 2, 4, ... doubling up to `block`, never past `total`.

    The first samples reach the output files (and the progress line) after one sample's generations, not after
    a whole block's: 50 samples of 100 generations (`mcmc`'s defaults) are half a minute of MC³ on DS1 on a
    2-core CPU before a user sees the run start.
    The count is data to the compiled block (one program whatever it is), and a function of the samples
    `done` alone, so a resumed run makes the blocks of one that never stopped."""
    return max(0, min(block, total - done, max(1, done)))


def to_numpy(state) -> dict:
    """A device state (any pytree of arrays) as host arrays, for a checkpoint."""
    return {"leaves": to_host(jax.tree.leaves(state))}


def from_numpy(saved: dict, like):
    """The state `to_numpy` saved, in the structure of `like`."""
    return jax.tree.unflatten(jax.tree.structure(like), [jnp.asarray(x) for x in saved["leaves"]])
