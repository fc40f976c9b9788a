"""The test suite of sandboxd: one package per layer (``tests.<layer>``)."""
