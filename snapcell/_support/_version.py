"""The package's version, in one place every layer may read."""

__all__ = ["VERSION"]

VERSION = "0.1.0"
