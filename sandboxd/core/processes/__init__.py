"""Background processes of a sandbox: their records, runs and output logs (SPEC §2.1)."""
