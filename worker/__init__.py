"""neardup: near-duplicate detection for Chinese web pages."""

__version__ = "0.1.0"
