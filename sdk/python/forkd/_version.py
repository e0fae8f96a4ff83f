"""The SDK's version (the forkd release it belongs to)."""

__version__ = "0.1.0"
