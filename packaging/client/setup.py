"""
Packaging for ``sandboxd-client``: ``HttpSandbox`` and ``sandboxctl`` alone (issue 19).

Built from the same tree as the daemon: ``sandboxd_client`` here is a link to the repository's
own package, so there is one copy of the code and two distributions. This one needs only what
the client imports; none of the daemon's dependencies (Klein, prometheus_client) and no C
compiler. ``pip install ./packaging/client`` (``[mcp]`` adds ``sandboxctl mcp``).
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent

setup(
    name="sandboxd-client",
    version="0.1.0",
    description="The client of sandboxd: HttpSandbox (treq) and the sandboxctl command line",
    long_description=(HERE / "README.rst").read_text(encoding="utf-8"),
    long_description_content_type="text/x-rst",
    python_requires=">=3.11",
    packages=["sandboxd_client", "sandboxd_client.cli", "sandboxd_client.mcp_server"],
    package_data={"sandboxd_client": ["py.typed"]},
    install_requires=[
        "twisted>=24.7",
        "treq>=24.9",
        "attrs>=23.1",
        "hyperlink>=21.0",
        "zope.interface>=5.0",
        "pybase64>=1.4",
        "rich>=13",  # sandboxctl's transfer progress (imported only to draw it)
    ],
    extras_require={
        "mcp": ["mcp>=2.3,<3"],
        "terminal": ["autobahn>=24.4"],  # sandboxctl shell: a terminal's WebSocket
    },
    entry_points={"console_scripts": ["sandboxctl = sandboxd_client.cli:main"]},
)
