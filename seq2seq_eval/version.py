"""The package version, in a module of its own: the package and its provenance both read it."""

__version__ = "0.1.0"
