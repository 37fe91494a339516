"""miniswe: a text-protocol coding agent."""

__version__ = "0.1.0"
