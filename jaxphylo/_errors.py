"""Exceptions raised by jaxphylo.

Every message is one line that names the file and the line, taxon or token at
fault, so that the command line can print it and exit without a traceback.
"""


class JaxphyloError(Exception):
    """Base class of every error jaxphylo raises on purpose."""


class InputError(JaxphyloError, ValueError):
    """A malformed or inconsistent alignment, tree or dates file."""


class ModelError(JaxphyloError, ValueError):
    """An invalid model string or an impossible parameter value."""
