"""The package version, in one place (read by the root package, the converter and the inspector)."""

__version__ = "0.1.0"
