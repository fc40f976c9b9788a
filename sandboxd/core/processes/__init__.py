"""Background processes of a sandbox: their output logs, their readers, their table."""
