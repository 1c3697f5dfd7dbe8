"""The package's version, importable without the package's lazy facade."""

__version__ = "0.1.0"
