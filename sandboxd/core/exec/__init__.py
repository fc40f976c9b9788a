"""Running one command in a sandbox: its spec (a plain value) and its process protocol."""
