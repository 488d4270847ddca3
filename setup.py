"""nvshim: host-level GPU runtime shim for Linux containers."""

from setuptools import find_packages, setup

setup(
    name="nvshim",
    version="0.1.0",
    description="Host-level GPU runtime shim for Linux containers: discovery, CDI, runtime, hook",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["nvshim", "nvshim.*"]),
    package_data={
        "nvshim.cdi": ["schema/*.json"],
        # the unit the node installer writes (one file: packaging/systemd)
        "nvshim.node": ["nvshim-runtimed.service"],
        # the compiled front's source (its builds are named by its digest: frontbin.py)
        "nvshim.runtime": ["front.c", "frontrt.c"],
    },
    install_requires=[
        "nvidia-ml-py>=12.535",
        "tomlkit>=0.12",
        "pyyaml>=6",
        "click>=8.1",
        "pyroute2>=0.7",
        "jsonschema>=4.18",
        "prometheus-client>=0.17",
        "grpcio>=1.60",  # nvshim dra: the kubelet plugin's gRPC servers
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "ruff",
            "grpcio",
            "container-runtime-interface-api",
            "kubernetes-validate",
        ],
    },
    entry_points={"console_scripts": ["nvshim=nvshim.entry:main"]},
)
