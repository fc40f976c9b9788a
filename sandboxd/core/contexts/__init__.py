"""Contexts: long-lived interpreter kernels inside a sandbox (docs/extensions.rst, "Contexts")."""
