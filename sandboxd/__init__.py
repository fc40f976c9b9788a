"""sandboxd: a self-hosted sandbox host for AI-agent applications."""

__version__ = "0.1.0"
