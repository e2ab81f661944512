"""Finding and reading a kubeconfig: kubectl's search order, and one-line errors naming the fix."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from vgpu_formats.kubeconfig import IN_CLUSTER_ENV, KubeconfigError, locate, read

CONFIG = """\
apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: dev
  context: {cluster: k, user: u, namespace: team}
- name: other
  context: {cluster: missing, user: u}
clusters:
- name: k
  cluster: {server: "https://10.0.0.1:6443", certificate-authority: ca.crt}
users:
- name: u
  user: {token: abc, client-key-data: %s}
"""


def _config(folder: Path, text: str | None = None) -> Path:
    path = folder / "config"
    path.write_text(text if text is not None else CONFIG % base64.b64encode(b"key").decode())
    return path


def test_the_flag_wins_then_kubeconfig_env_then_home_then_the_pod(tmp_path: Path) -> None:
    flag, env, home = tmp_path / "flag", tmp_path / "env", tmp_path / "home"
    for folder in (flag, env, home / ".kube"):
        folder.mkdir(parents=True)
        _config(folder)
    environ = {"KUBECONFIG": f"{tmp_path / 'absent'}:{env / 'config'}", IN_CLUSTER_ENV: "10.0.0.1"}
    assert locate(str(flag / "config"), environ, home) == flag / "config"
    assert locate(None, environ, home) == env / "config"  # the first of the list that exists
    assert locate(None, {IN_CLUSTER_ENV: "10.0.0.1"}, home) == home / ".kube" / "config"
    assert locate(None, {IN_CLUSTER_ENV: "10.0.0.1"}, tmp_path / "nohome") is None  # the service account


@pytest.mark.parametrize(("explicit", "environ", "names"), [
    ("/nonexistent", {}, ["--kubeconfig /nonexistent", "no such file"]),
    (None, {"KUBECONFIG": "/nope"}, ["$KUBECONFIG=/nope", "unset it"]),
    (None, {}, ["--kubeconfig", "$KUBECONFIG", "not a pod"]),
])
def test_nothing_found_says_what_to_pass(tmp_path: Path, explicit: str | None, environ: dict[str, str],
                                         names: list[str]) -> None:
    with pytest.raises(KubeconfigError) as raised:
        locate(explicit, environ, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and all(name in message for name in names), message


def test_read_resolves_the_context_and_relative_files(tmp_path: Path) -> None:
    connection = read(_config(tmp_path))
    assert (connection.context, connection.namespace) == ("dev", "team")
    assert connection.server == "https://10.0.0.1:6443"
    assert connection.ca_path == str(tmp_path / "ca.crt")  # relative to the kubeconfig, as kubectl
    assert connection.token == "abc" and connection.key_data == b"key"


def test_line_wrapped_base64_reads_as_kubectl_reads_it(tmp_path: Path) -> None:
    key = bytes(range(256)) * 2
    wrapped = base64.encodebytes(key).decode()  # 76 characters a line, as `base64` writes it
    assert "\n" in wrapped.strip()
    block = wrapped.strip().replace("\n", "\n      ")
    path = _config(tmp_path, CONFIG.replace("user: {token: abc, client-key-data: %s}",
                                            f"user:\n    client-key-data: |\n      {block}"))
    assert read(path).key_data == key
    with pytest.raises(KubeconfigError, match="client-key-data is not base64"):
        read(_config(tmp_path, CONFIG % "not*base64"))


def test_the_secrets_are_not_in_the_repr(tmp_path: Path) -> None:
    text = repr(read(_config(tmp_path)))
    assert "abc" not in text and "key" not in text.replace("key_path", "")
    assert "https://10.0.0.1:6443" in text  # the rest still is


@pytest.mark.parametrize(("text", "fragment"), [
    ("a: [", "not valid YAML"),
    ("just: text\n", "not a kubeconfig"),
    ("clusters: []\n", "no current-context"),
    ("current-context: x\ncontexts: []\n", "no context named 'x'"),
])
def test_a_broken_kubeconfig_is_named_with_its_problem(tmp_path: Path, text: str, fragment: str) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(KubeconfigError) as raised:
        read(path)
    assert str(path) in str(raised.value) and fragment in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_context_naming_a_missing_cluster_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"no cluster named 'missing' .*context 'other'.*it has: k"):
        read(_config(tmp_path), "other")
