"""The package's version, written once (``dana.__version__``, pyproject's dynamic version).

A module of its own so that modules inside the package (the command, :func:`dana.fit`)
can read it without importing the package ``dana`` itself.
"""

__version__ = "0.1.0"
