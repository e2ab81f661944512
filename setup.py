"""Generates the device plugin's gRPC stubs from its .proto during every build, so `pip install .`
from a clean clone (where the stubs, being generated, are absent) gives a plugin that starts.
Everything else about the package is in pyproject.toml."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCE = ROOT / "deviceplugin"


class BuildPyWithStubs(build_py):
    """build_py that first runs protoc (grpcio-tools, a build requirement) as `make proto` does."""

    def run(self) -> None:
        import grpc_tools
        from grpc_tools import protoc

        includes = Path(grpc_tools.__file__).parent / "_proto"
        for proto in sorted((SOURCE / "vgpu_deviceplugin" / "api").glob("*.proto")):
            # -I<deviceplugin> makes the stubs import each other as vgpu_deviceplugin.api.*
            code = protoc.main(["protoc", f"-I{SOURCE}", f"-I{includes}", f"--python_out={SOURCE}",
                                f"--pyi_out={SOURCE}", f"--grpc_python_out={SOURCE}", str(proto)])
            if code != 0:
                raise RuntimeError(f"protoc failed on {proto} (exit {code})")
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
