"""Serve an emulator on 127.0.0.1 (a free port) and write a kubeconfig that points at it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from collections.abc import AsyncIterator

import aiohttp.test_utils
import yaml

from vgpu_emulator.emulator import Emulator
from vgpu_emulator.loader import load_manifests


def kubeconfig_text(server_url: str) -> str:
    """A kubeconfig for the emulator: plain HTTP, a dummy token (the emulator checks none)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server_url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
        "current-context": "emulator",
    }
    return yaml.safe_dump(config, sort_keys=False)


class RunningEmulator:
    """What `run_emulator` yields: the emulator, its URL and its kubeconfig file."""

    def __init__(self, emulator: Emulator, url: str, kubeconfig: pathlib.Path) -> None:
        self.emulator = emulator
        self.url = url
        self.kubeconfig = kubeconfig


@contextlib.asynccontextmanager
async def run_emulator(
    *manifests: str | pathlib.Path,
    kubeconfig: str | pathlib.Path | None = None,
    emulator: Emulator | None = None,
) -> AsyncIterator[RunningEmulator]:
    """Start an emulator (loaded with the given manifest files/folders) on 127.0.0.1.

    The kubeconfig goes to `kubeconfig` if given, else to a private temporary file that is
    removed on exit.
    """
    emulator = emulator if emulator is not None else Emulator()
    load_manifests(emulator, *manifests)
    with contextlib.ExitStack() as cleanup:
        if kubeconfig is None:
            folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="vgpu-emulator-"))
            kubeconfig = pathlib.Path(folder) / "kubeconfig"
        path = pathlib.Path(kubeconfig)
        async with emulator, aiohttp.test_utils.RawTestServer(emulator, host="127.0.0.1", port=0) as server:
            url = str(server.make_url("")).rstrip("/")
            path.write_text(kubeconfig_text(url))
            os.chmod(path, 0o600)
            try:
                yield RunningEmulator(emulator, url, path)
            finally:
                emulator.release_faults()  # a hanging request must not hold the server's shutdown
