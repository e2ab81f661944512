"""What a vGPU container gets of the host: its region file only, created by the plugin, kept to
the region's size; no lock directory. libvgpu.so and the monitor work with a file made so."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from vgpu_deviceplugin import main as entry
from vgpu_deviceplugin.allocator import make_region_file, write_settings_file
from vgpu_deviceplugin.cleanup import trim
from vgpu_deviceplugin.monitor.region import FILE_SIZE as REGION_SIZE
from vgpu_deviceplugin.monitor.scan import read_container, scan
from vgpuctl import chain

from tests.support.required import unavailable


def _region(root: Path, folder: str = "uid-1_cuda", name: str = "id.cache") -> Path:
    path = root / folder / name
    make_region_file(str(path))
    return path


def test_the_region_file_is_made_for_any_uid_in_a_folder_only_the_plugin_writes(tmp_path: Path) -> None:
    (tmp_path / "uid-1_cuda").mkdir(mode=0o777)
    os.chmod(tmp_path / "uid-1_cuda", 0o1777)  # as an older plugin left it
    path = _region(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert path.read_bytes() == bytes(REGION_SIZE)
    assert path.stat().st_blocks * 512 < REGION_SIZE, "sparse: no disk used until written"
    path.write_bytes(b"\x01" * REGION_SIZE)
    make_region_file(str(path))  # a container restarted: the same file, its contents kept
    assert path.read_bytes() == b"\x01" * REGION_SIZE


def test_a_link_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("host file")
    (tmp_path / "uid-1_cuda").mkdir()
    (tmp_path / "uid-1_cuda" / "id.cache").symlink_to(target)
    with pytest.raises(OSError):
        make_region_file(str(tmp_path / "uid-1_cuda" / "id.cache"))
    assert target.read_text() == "host file"


def test_the_monitor_waits_for_the_header_without_a_warning(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = _region(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert read_container(path.parent) is None
    assert caplog.text == ""


def test_the_settings_file_is_replaced_whole_and_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "uid-1_cuda" / "vgpu.env"
    write_settings_file(str(path), "CUDA_DEVICE_SM_LIMIT=30\n")
    write_settings_file(str(path), "CUDA_DEVICE_SM_LIMIT=50\n")
    assert path.read_text() == "CUDA_DEVICE_SM_LIMIT=50\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the hook refuses a group/other-writable one
    assert os.listdir(path.parent) == ["vgpu.env"]
    # A rename that fails (here: a folder in the way) leaves no temporary file.
    blocked = tmp_path / "uid-2_cuda" / "vgpu.env"
    blocked.mkdir(parents=True)
    with pytest.raises(OSError):
        write_settings_file(str(blocked), "CUDA_DEVICE_SM_LIMIT=30\n")
    assert os.listdir(blocked.parent) == ["vgpu.env"] and blocked.is_dir()


def test_trim_cuts_grown_region_files_back_to_the_region(tmp_path: Path) -> None:
    grown, kept = _region(tmp_path, "uid-1_a"), _region(tmp_path, "uid-2_b")
    with grown.open("r+b") as file:
        file.seek(REGION_SIZE + (64 << 20))
        file.write(b"filling the node's disk")
    assert trim(str(tmp_path)) == ["uid-1_a/id.cache"]
    assert grown.stat().st_size == kept.stat().st_size == REGION_SIZE
    assert trim(str(tmp_path)) == [] and trim(str(tmp_path / "missing")) == []


def test_libvgpu_uses_the_file_the_plugin_made_and_the_monitor_reads_it(tmp_path: Path) -> None:
    found = chain.hook_artifacts()
    if isinstance(found, str):
        unavailable(f"needs the hook: {found}")
    # run_hook puts the region at <workdir>/container-cache/<name of the env's file>: make it there
    # first, as Allocate does before the container starts.
    _region(tmp_path, "container-cache", "abc.cache")
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/abc.cache"}
    run = chain.run_hook(env, tmp_path)
    assert run.ran and run.returncode == 0, run
    assert "refused at step 7 with 3000 MiB held" in run.output
    containers = tmp_path / "containers"
    containers.mkdir()
    (tmp_path / "container-cache").rename(containers / "uid-1_cuda")
    assert trim(str(containers)) == []  # the hook kept to the region's size
    [region] = scan(str(containers))
    assert region.path.endswith("abc.cache") and region.region.devices[0].limit_bytes == 3000 << 20


def test_the_old_lock_dir_flag_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vgpu_deviceplugin"):
        code = entry.main(["--node-name", "n", "--lock-dir", "/tmp/vgpulock", "--mock-gpus", "bogus"])
    assert code == 1  # the bogus GPU spec stops it after the flags were read
    assert "flag --lock-dir has no effect" in caplog.text
