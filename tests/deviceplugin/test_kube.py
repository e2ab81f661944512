"""The plugin's own API client: its connection from the shared kubeconfig parser
(vgpu_formats.kubeconfig), TLS and token, against a local HTTPS server."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from vgpu_deviceplugin.kube import ApiKubeClient, KubeError, from_kubeconfig, in_cluster
from vgpu_formats.kubeconfig import KubeconfigError


def kubeconfig(path: Path, cluster: dict[str, object], user: dict[str, object]) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}]}))
    return str(path)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_with_ca_data_and_token(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    seen: list[str] = []

    async def configmap(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.match_info["name"] == "missing":
            return web.json_response({"message": "not found"}, status=404)
        return web.json_response({"data": {"k": "v"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", configmap)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ca_data = base64.b64encode(cert.read_bytes()).decode()
    # A client certificate and key given as data (line-wrapped, as `base64` writes it) load as a pair.
    pair = kubeconfig(tmp_path / "kc3", {"server": f"https://127.0.0.1:{port}"},
                      {"client-certificate-data": base64.encodebytes(cert.read_bytes()).decode(),
                       "client-key-data": base64.encodebytes(key.read_bytes()).decode()})
    assert isinstance(from_kubeconfig(pair).ssl, ssl.SSLContext)
    path = kubeconfig(tmp_path / "kc", {"server": f"https://127.0.0.1:{port}",
                                        "certificate-authority-data": ca_data}, {"token": "s3cret"})
    client = await ApiKubeClient.connect(path)
    try:
        assert await client.get_configmap("kube-system", "cm") == {"k": "v"}
        assert await client.get_configmap("kube-system", "missing") is None
        assert seen == ["Bearer s3cret", "Bearer s3cret"]
    finally:
        await client.close()
        await runner.cleanup()
    # A server whose certificate the CA does not vouch for is refused, with the object named.
    other = kubeconfig(tmp_path / "kc2", {"server": f"https://127.0.0.1:{port}"}, {"token": "t"})
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls)
    await site.start()
    client = await ApiKubeClient.connect(other)
    try:
        with pytest.raises(KubeError, match="ConfigMap kube-system/cm"):
            await client.get_configmap("kube-system", "cm")
    finally:
        await client.close()
        await runner.cleanup()


def test_unsupported_kubeconfigs_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exec_user = kubeconfig(tmp_path / "kc", {"server": "https://x"}, {"exec": {"command": "aws"}})
    with pytest.raises(KubeError, match="exec/auth-provider users are not supported"):
        from_kubeconfig(exec_user)
    # Read by the parser every command shares: its one-line errors.
    no_context = tmp_path / "empty"
    no_context.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubeconfigError, match="no current-context"):
        from_kubeconfig(str(no_context))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeError, match="pass --kubeconfig"):
        in_cluster()


def test_a_token_file_is_read_again_on_each_call(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    connection = from_kubeconfig(kubeconfig(tmp_path / "kc", {"server": "http://127.0.0.1:1/"},
                                            {"tokenFile": "token"}))  # relative to the kubeconfig
    assert connection.server == "http://127.0.0.1:1" and connection.ssl is False
    assert connection.headers() == {"Authorization": "Bearer first"}
    token.write_text("rotated\n")
    assert connection.headers() == {"Authorization": "Bearer rotated"}
    inline = from_kubeconfig(kubeconfig(tmp_path / "kc2", {"server": "http://x"}, {"token": "s3cret"}))
    assert inline.headers() == {"Authorization": "Bearer s3cret"} and "s3cret" not in repr(inline)
