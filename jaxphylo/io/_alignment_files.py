"""Reading alignments: FASTA and NEXUS through Biopython, PHYLIP of every flavour."""

from __future__ import annotations

import os
import re

from ..data import Alignment, DNA, alphabet_for
from .._errors import InputError

_DNA_SYMBOLS = set("ACGTUNRYSWKMBDHV-?.")


def read_alignment(path, data_type: str | None = None, genetic_code: int = 1) -> Alignment:
    """Read an aligned FASTA, PHYLIP (sequential or interleaved, relaxed names) or NEXUS file.

    `data_type` is 'dna', 'protein' or 'codon'; left out, DNA or protein is
    guessed from the characters. `genetic_code` is an NCBI table number, used
    for codons.
    """
    path = os.fspath(path)
    text = read_text(path, "alignment")
    stripped = text.lstrip()
    if stripped.startswith(">"):
        taxa, sequences = _read_fasta(path)
    elif stripped[:6].upper() == "#NEXUS":
        taxa, sequences = _read_nexus(path)
    elif re.match(r"\d+\s+\d+", stripped):
        taxa, sequences = _read_phylip(text, path)
    else:
        raise InputError(f"{path}: not a FASTA, PHYLIP or NEXUS alignment (line 1: {stripped[:30]!r})")
    sequences = tuple(s.upper() for s in sequences)
    if data_type is None:
        data_type = _guess_data_type(sequences)
    return Alignment(tuple(taxa), sequences, alphabet_for(data_type, genetic_code), path)


def read_text(path: str, what: str) -> str:
    """The whole of a text file, or an `InputError` naming it: unreadable, or binary (undecodable or NUL bytes)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read {what}: {err.strerror}") from None
    if (nul := raw.find(b"\0")) >= 0:
        raise InputError(f"{path}: cannot read {what}: not a text file (byte {nul + 1} is NUL)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: cannot read {what}: not a text file (byte {err.start + 1} is not UTF-8)") from None


def _guess_data_type(sequences) -> str:
    joined = "".join(sequences[:50])
    letters = set(joined)
    acgt = sum(joined.count(c) for c in "ACGTUN")
    gaps = sum(joined.count(c) for c in "-?.")
    if letters <= _DNA_SYMBOLS and acgt >= 0.5 * max(len(joined) - gaps, 1):
        return DNA.name
    return "protein"


def _read_fasta(path):
    from Bio import SeqIO

    taxa, sequences = [], []
    with open(path) as handle:
        for record in SeqIO.parse(handle, "fasta"):
            taxa.append(record.description.strip())
            sequences.append(str(record.seq).replace(" ", ""))
    return taxa, sequences


def _read_nexus(path):
    from Bio import AlignIO

    try:
        alignment = AlignIO.read(path, "nexus")
    except Exception as err:  # Biopython raises many types; all mean a malformed file
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{path}: malformed NEXUS alignment: {message}") from None
    return [r.id for r in alignment], [str(r.seq) for r in alignment]


def _read_phylip(text, path):
    """Relaxed PHYLIP: names end at the first whitespace; sequential or interleaved."""
    lines = [(n + 1, line.strip()) for n, line in enumerate(text.splitlines()) if line.strip()]
    header = lines[0][1].split()
    num_taxa, num_sites = int(header[0]), int(header[1])
    body = lines[1:]
    for reader in (_phylip_interleaved, _phylip_sequential):
        parsed = reader(body, num_taxa, num_sites)
        if parsed is not None:
            return parsed
    raise InputError(
        f"{path}: malformed PHYLIP: expected {num_taxa} sequences of {num_sites} sites "
        f"(line {body[min(num_taxa, len(body)) - 1][0] if body else 1})"
    )


def _phylip_interleaved(body, num_taxa, num_sites):
    if len(body) < num_taxa:
        return None
    taxa, chunks = [], []
    for _, line in body[:num_taxa]:
        name, rest = (line.split(None, 1) + [""])[:2]
        taxa.append(name)
        chunks.append([rest.replace(" ", "")])
    for k, (_, line) in enumerate(body[num_taxa:]):
        chunks[k % num_taxa].append(line.replace(" ", ""))
    sequences = ["".join(c) for c in chunks]
    if all(len(s) == num_sites for s in sequences):
        return taxa, sequences
    return None


def _phylip_sequential(body, num_taxa, num_sites):
    taxa, sequences, lines = [], [], iter(body)
    for _ in range(num_taxa):
        try:
            _, line = next(lines)
        except StopIteration:
            return None
        name, rest = (line.split(None, 1) + [""])[:2]
        sequence = rest.replace(" ", "")
        while len(sequence) < num_sites:
            try:
                sequence += next(lines)[1].replace(" ", "")
            except StopIteration:
                return None
        if len(sequence) != num_sites:
            return None
        taxa.append(name)
        sequences.append(sequence)
    return taxa, sequences
