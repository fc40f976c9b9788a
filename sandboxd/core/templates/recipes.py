"""Built-in recipes: Dockerfiles the daemon knows by name (docs/extensions.rst, "Built-in
recipes").

A build whose JSON body is ``{"recipe": NAME}`` builds that recipe's Dockerfile as if it had
been sent as ``dockerfile``, with the network its ``RUN`` needs (``host``: ``apt-get``
downloads) unless the body names one. Everything else is a build's: the template's name is the
route's, its progress the build's frames, and a name taken is ``409`` (a template is never
replaced).
"""

from attrs import frozen


@frozen
class Recipe:
    """A named Dockerfile and the network its ``RUN`` steps need."""

    name: str
    dockerfile: str
    network: str


CODE_INTERPRETER = Recipe(
    "code-interpreter",
    "FROM debian:bookworm\n"
    "RUN apt-get update \\\n"
    " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\\n"
    "    python3 python3-ipykernel python3-numpy python3-pandas python3-matplotlib \\\n"
    "    python3-munkres \\\n"
    " && apt-get clean && rm -rf /var/lib/apt/lists/*\n",
    "host",
)
"""What E2B's ``code-interpreter-v1`` holds for its kernels: Debian's python3 with ipykernel,
numpy, pandas and matplotlib (the E2B front runs ``Sandbox.create(template=
"code-interpreter-v1")`` in the template of this name, docs/e2b.rst, "Code interpreter").

``python3-munkres`` (a few kB) is there for apt's choice: matplotlib needs fonttools, which
needs ``python3-scipy | python3-munkres``; without munkres apt takes scipy, whose pythran
brings g++, Boost's headers and OpenBLAS's (about 570 MB of the 970 MB it would install)."""

RECIPES = {recipe.name: recipe for recipe in (CODE_INTERPRETER,)}
"""Every built-in recipe by name."""


def names() -> str:
    """The recipes' names, for a message."""
    return ", ".join(sorted(RECIPES))
