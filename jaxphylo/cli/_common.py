"""What several commands share: the example, model and partition options, devices and meshes."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from .._errors import InputError, JaxphyloError

if TYPE_CHECKING:
    from jax.sharding import Mesh

EXAMPLE_MODEL = "HKY{4.0}+F{0.3,0.2,0.2,0.3}+G4{0.5}"
SAMPLE_MODEL = "HKY+G4"  # sample's model without -m (with -p/-q/-Q FILE: none, the file names every part's)


def example_paths():
    from .._examples import example_paths as paths

    return paths()


def digest(path) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:16]
    except OSError as err:
        raise JaxphyloError(f"{path}: cannot read: {err.strerror}") from None


def add_data_options(parser, codons: bool = True) -> None:
    """--precision, --data-type and --genetic-code."""
    parser.add_argument("--precision", choices=("float64", "float32"), default="float64")
    parser.add_argument("--data-type", choices=("dna", "protein", "codon") if codons else ("dna", "protein"),
                        default=None, help="default: DNA or protein, guessed from the characters")
    if codons:
        parser.add_argument("--genetic-code", type=int, default=1, help="NCBI table number for codons (default 1)")


LINKS = {"p": "proportional", "q": "equal", "Q": "unlinked"}


def add_partition_options(parser, unlinked: str = "partitions with unlinked branch lengths (each part its own)"):
    """IQ-TREE's -p, -q and -Q FILE on a command (`unlinked`: what -Q means there)."""
    parser.add_argument("-p", metavar="FILE", help="partitions (NEXUS sets/charpartition or RAxML-style), a model "
                                                   "each: linked branch lengths times a rate per part")
    parser.add_argument("-q", metavar="FILE", help="partitions with linked, equal branch lengths")
    parser.add_argument("-Q", metavar="FILE", help=unlinked)


def partition_choice(args) -> tuple[str, str] | None:
    """`(partition file, link)` of -p/-q/-Q, or None."""
    flags = [(getattr(args, flag), LINKS[flag]) for flag in LINKS if getattr(args, flag, None)]
    if len(flags) > 1:
        raise JaxphyloError("give one of -p, -q and -Q")
    return flags[0] if flags else None


def partitioned_model_of(args, alignment, default_model: str | None, rates=None, scheme=None):
    """The partitioned model of -p/-q/-Q: the file's models, `default_model` (-m; None without it) for parts
    without one."""
    import jaxphylo as jp

    path, link = partition_choice(args)
    scheme = scheme or jp.read_partitions(path)
    require_part_models(scheme, default_model)
    return jp.partitioned_model(scheme, alignment, default_model=default_model, link=link, rates=rates)


def require_part_models(scheme, default_model: str | None) -> None:
    """Without -m every part of the partition file must name its model (as in IQ-TREE's `charpartition mine =
    HKY+G4:gene1, ...`): else a one-line error naming the first part without one and its line."""
    if default_model is not None:
        return
    for k, (name, model) in enumerate(zip(scheme.names, scheme.models)):
        if model is None:
            raise JaxphyloError(f"{scheme._where(k)}: part {name!r} names no model; give -m MODEL (the model of "
                                "the parts that name none) or name its model in the file")


def model_or_partitions(args, command: str, default: str | None = None) -> str | None:
    """-m, else `default`; without either, -p/-q/-Q FILE must name every part's model (checked when it is read)."""
    model = args.model or default
    if model is None and partition_choice(args) is None:
        raise JaxphyloError(f"{command} needs --model MODEL (or -p/-q/-Q FILE naming every part's model)")
    return model


_MESH_ITEM = re.compile(r"^\s*(batch|patterns)\s*=\s*(\d+)\s*$")


def select_devices(count: int | None) -> list:
    """The first `count` of `jax.devices()` (every process's devices), or all of them for None."""
    import jax

    devices = jax.devices()
    if count is None:
        return devices
    if not 1 <= count <= len(devices):
        raise InputError(f"--devices {count}: there are {len(devices)} devices ({devices[0].platform})")
    return devices[:count]


def parse_mesh_option(text: str, devices) -> "Mesh":
    """`batch=B,patterns=P` (either may be left out: it takes the rest of the devices) as a mesh over `devices`.

    `B x P` must be the number of devices; a bad item, a repeated axis or a
    product that does not match is a one-line `InputError`.
    """
    from ..runtime import device_mesh

    devices = list(devices)
    sizes: dict[str, int] = {}
    for item in text.split(","):
        match = _MESH_ITEM.match(item)
        if not match:
            raise InputError(f"--mesh {text!r}: expected batch=B,patterns=P (positive integers), not {item.strip()!r}")
        name, size = match.group(1), int(match.group(2))
        if name in sizes:
            raise InputError(f"--mesh {text!r}: {name} is given twice")
        if size < 1:
            raise InputError(f"--mesh {text!r}: {name} must be at least 1")
        sizes[name] = size
    batch, patterns = sizes.get("batch"), sizes.get("patterns")
    n = len(devices)
    if batch is not None and patterns is not None and batch * patterns != n:
        raise InputError(f"--mesh {text!r}: batch x patterns = {batch * patterns}, but there are {n} devices")
    for name, size in sizes.items():
        if n % size:
            raise InputError(f"--mesh {text!r}: {name}={size} does not divide the {n} devices")
    return device_mesh(devices, batch=batch, patterns=patterns)


def add_mesh_options(parser, default: str) -> None:
    """`--devices N` and `--mesh batch=B,patterns=P` on a command that runs on many devices (`default`: the
    mesh it picks without them)."""
    parser.add_argument("--devices", type=int, default=None, help="use the first N devices (default: all visible)")
    parser.add_argument("--mesh", help=f"device mesh batch=B,patterns=P (default: {default})")


def mesh_choice(args, trees: int, num_patterns: int, default: bool = True):
    """The mesh of `--devices`/`--mesh`; without them, with `default`, the default mesh over every device
    (`default_mesh_shape`); None where that is one device (nothing to spread)."""
    from ..runtime import run_mesh

    if not default and args.devices is None and args.mesh is None:
        return None
    devices = select_devices(args.devices)
    if args.mesh:
        mesh = parse_mesh_option(args.mesh, devices)
        return None if mesh.devices.size == 1 else mesh
    return run_mesh(devices, trees=trees, num_patterns=num_patterns)


def mesh_lines(mesh, num_patterns: int | None = None, taxa: int | None = None, how: str = "") -> list[str]:
    """The mesh's shape and, for a data set, the pattern shard per device."""
    from ..runtime import padded_pattern_count

    batch, patterns = mesh.shape["batch"], mesh.shape["patterns"]
    line = f"mesh: batch={batch} x patterns={patterns}" + (f" ({how})" if how else "")
    if num_patterns is not None:
        padded = padded_pattern_count(num_patterns, mesh)
        line += (f"; {taxa} taxa x {num_patterns} patterns -> {padded // patterns} patterns per device"
                 + (f" ({padded - num_patterns} padding)" if padded > num_patterns else ""))
    return [line]
