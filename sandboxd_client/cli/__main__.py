"""``python -m sandboxd_client.cli``: the same as the ``sandboxctl`` console script."""

from . import main

main()
