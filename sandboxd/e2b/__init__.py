"""The E2B-compatible front (SPEC §8): the official E2B SDK, unmodified, against sandboxd."""
