"""The E2B-compatible front (docs/e2b.rst): the official E2B SDK, unmodified, against sandboxd."""
