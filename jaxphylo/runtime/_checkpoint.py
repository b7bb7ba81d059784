"""What every long command shares: stop requests, time budgets, and checkpoints that cannot half-load.

A cluster scheduler announces a kill with SIGTERM (Slurm, PBS) or SIGUSR1
(`#SBATCH --signal`), 30-120 s ahead; a user presses Ctrl-C. `StopRequests`
turns any of them, or a `--max-time` budget running out, into a flag that
the samplers and searches read between iterations; they then save and raise
`Interrupted`, which the command line reports with how to resume and exit
status 75 (EX_TEMPFAIL: "try again"). A second Ctrl-C stops at once.

A checkpoint file is `MAGIC`, one JSON header line (payload length and
SHA-256, the settings it belongs to) and a pickled payload. It is written to
a temporary file, fsynced and renamed over the old one, so a kill during
the write leaves the previous checkpoint whole; on reading, a wrong length
or digest (a truncated or corrupted file) is refused before unpickling.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import signal
import time
import zipfile
from pathlib import Path

import numpy as np

from .._errors import InputError, JaxphyloError

MAGIC = b"JAXPHYLO-CHECKPOINT 1\n"
EXIT_INTERRUPTED = 75
SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)


class Interrupted(JaxphyloError):
    """A run stopped on request after saving its checkpoint; the message says how to resume."""


class CheckpointError(InputError):
    """A checkpoint that is damaged or belongs to another analysis."""


def parse_duration(text: str | None) -> float | None:
    """Seconds in `23h`, `90m`, `45s`, `2d`, `1h30m`, `36:00:00` (Slurm's H:M:S) or a plain number of seconds."""
    if text is None:
        return None
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d*)?", text):
        return float(text)
    if re.fullmatch(r"\d+(:\d+){1,2}", text):
        seconds = 0.0
        for part in text.split(":"):
            seconds = 60 * seconds + int(part)
        return seconds
    compact = re.sub(r"\s+", "", text.lower())
    pieces = re.findall(r"(\d+(?:\.\d*)?)([dhms])", compact)
    if not pieces or "".join(a + b for a, b in pieces) != compact:
        raise InputError(f"--max-time {text!r}: write a duration such as 23h, 90m, 1h30m or 36:00:00")
    return sum(float(a) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[b] for a, b in pieces)


class StopRequests:
    """A flag raised by SIGTERM, SIGINT, SIGUSR1 or a time budget; use as a context manager.

    `reason` is None while the run should go on. Handlers are installed only in
    the main thread and restored on exit; a second SIGINT raises KeyboardInterrupt.
    With `ignore_after=True`, a block that ends without an exception (the run
    finished and wrote everything) ignores SIGTERM and SIGUSR1 from then on
    instead: one that arrives while the process exits (a Slurm signal just too
    late) must not turn a finished run into a killed one (exit 143).
    """

    def __init__(self, max_seconds: float | None = None, ignore_after: bool = False):
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self.max_seconds = max_seconds
        self.ignore_after = ignore_after
        self._signal = None
        self._previous = {}

    def __enter__(self):
        try:
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay with their owner
            self._previous = {}
        return self

    def __exit__(self, exc_type, *exc):
        finished = self.ignore_after and exc_type is None
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if finished and sig != signal.SIGINT else handler)
        return False

    def _handle(self, number, frame):
        if self._signal == signal.SIGINT and number == signal.SIGINT:
            raise KeyboardInterrupt
        self._signal = number

    @property
    def reason(self) -> str | None:
        if self._signal is not None:
            return f"received {signal.Signals(self._signal).name}"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return f"--max-time of {self.max_seconds:g} s reached"
        return None


NEVER = StopRequests()  # for callers without signals or budgets


def stop_point(stop: StopRequests, save, checkpoint=None, progress: str = "") -> None:
    """A place where a run may stop: if a stop was requested, `save()` (when there is a checkpoint) and raise
    `Interrupted`, whose message says where the run stood (`progress`) and how to resume it."""
    if (reason := stop.reason) is None:
        return
    if checkpoint is None:
        raise Interrupted(f"{reason}: stopped {progress} (no checkpoint was asked for)")
    save()
    raise Interrupted(f"{reason}: saved in {checkpoint} {progress}; continue with the same command and --resume")


def alignment_digest(alignment) -> str:
    """What a checkpoint records of its data: the taxa and sequences, hashed."""
    return hashlib.sha256(repr((alignment.taxa, alignment.sequences)).encode()).hexdigest()


def settings_digest(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def atomic_write(path, write) -> None:
    """`write(handle)` into `path` atomically: a temporary file, fsync, rename (and fsync of the folder)."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def save_checkpoint(path, payload, settings: dict) -> None:
    """`payload` (anything picklable: NumPy arrays, not device arrays) saved for `settings`."""
    body = _canonical_pickle(payload)
    header = json.dumps({"length": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                         "settings": settings_digest(settings), "record": settings}, sort_keys=True).encode()
    atomic_write(path, lambda h: h.write(MAGIC + header + b"\n" + body))


def _canonical_pickle(payload) -> bytes:
    """A pickle that depends on the payload's values only: without the memo, which records object identity
    (a fresh array's dtype is shared, a reloaded one's is not), so equal states give equal bytes."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    pickler.fast = True  # no memo; checkpoint payloads hold no cycles
    pickler.dump(payload)
    return buffer.getvalue()


def load_checkpoint(path, settings: dict):
    """The payload saved at `path`; `CheckpointError` in one line if it is damaged or for other settings."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {err.strerror}") from None
    if not raw.startswith(MAGIC) or b"\n" not in raw[len(MAGIC):]:
        raise CheckpointError(f"{path}: not a jaxphylo checkpoint, or truncated before its header")
    line, body = raw[len(MAGIC):].split(b"\n", 1)
    try:
        header = json.loads(line)
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: damaged checkpoint header") from None
    if len(body) != header["length"]:
        raise CheckpointError(f"{path}: truncated checkpoint ({len(body)} of {header['length']} bytes); "
                              f"it cannot be resumed")
    if hashlib.sha256(body).hexdigest() != header["sha256"]:
        raise CheckpointError(f"{path}: corrupted checkpoint (checksum differs); it cannot be resumed")
    if header.get("settings") != settings_digest(settings):
        now = json.loads(json.dumps(settings, sort_keys=True))  # tuples as lists, as the header holds them
        compare_settings(str(path), _flat(header.get("record", {})), _flat(now))
        raise CheckpointError(f"{path}: the checkpoint belongs to other settings or data than this command's")
    return pickle.loads(body)


def compare_settings(where: str, saved: dict, now: dict, ignore=()) -> None:
    """One line naming the first setting that differs between a saved run and this command."""
    for key in sorted(set(saved) | set(now)):
        if key not in ignore and saved.get(key) != now.get(key):
            raise CheckpointError(f"{where} holds a different analysis: {key} was {_short(saved.get(key))} there, "
                                  f"{_short(now.get(key))} now")


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _flat(record: dict, prefix: str = "") -> dict:
    """Nested settings as one level (`settings.radius`), so that a difference is named down to its leaf."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def write_npz(handle, arrays: dict) -> None:
    """`np.savez` without the time stamps zip members carry, so equal arrays give equal bytes."""
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
        for name, value in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(value), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
