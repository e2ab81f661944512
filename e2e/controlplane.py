"""A real Kubernetes control plane on 127.0.0.1 for the e2e suite, built from registries.

    python -m e2e.controlplane build   # build etcd, kube-apiserver, kube-controller-manager and
                                       # promtool (the monitoring tests), or reuse them
    python -m e2e.controlplane up      # start them (a no-op when they already run)
    python -m e2e.controlplane down    # stop exactly what `up` started, remove its state.json
    python -m e2e.controlplane status  # exit 0 when running and ready

The binaries come from the Go modules pinned in `e2e/tools/*/go.mod` (etcd from
`go.etcd.io/etcd/server/v3`, the Kubernetes binaries from `k8s.io/kubernetes`), built with the Go
module proxy, as envtest does. A build is cached under `$VGPU_E2E_CACHE` (default
`~/.cache/vgpu-operator/e2e`) keyed by a hash of that module's go.mod, go.sum and the Go version,
so it is rebuilt only when a pin changes; a fresh clone on the same machine reuses it.

`up` makes a CA and certificates with `openssl`, starts etcd, kube-apiserver (RBAC on, an audit
log of every request at Metadata level) and kube-controller-manager (service-account tokens,
garbage collection, namespaces, Deployments), and writes an admin kubeconfig. Everything lives in
`.e2e/` at the repository root (git-ignored): `kubeconfig`, `audit.log`, `logs/`, `state.json`.
`--oldest` does the same for the oldest release the README claims (API server only) in `.e2e-oldest/`.
There is no kubelet and no scheduler: pods stay Pending, which the tests rely on only as objects.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).resolve().parent / "tools"
CACHE = Path(os.environ.get("VGPU_E2E_CACHE") or Path.home() / ".cache" / "vgpu-operator" / "e2e")


@dataclass(frozen=True)
class Tool:
    """A Go tools module and the commands built from it."""

    module: str  # folder under e2e/tools
    pin: str  # the required module whose version names the build
    commands: tuple[tuple[str, str], ...]  # (binary name, Go package)


ETCD = Tool("etcd", "go.etcd.io/etcd/server/v3", (("etcd", "go.etcd.io/etcd/server/v3"),))
KUBERNETES = Tool("kubernetes", "k8s.io/kubernetes", (
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager")))
KUBERNETES_OLDEST = Tool("kubernetes-oldest", "k8s.io/kubernetes", (
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),))
# Not part of the control plane: the monitoring tests run promtool on the chart's rules and scrapes.
PROMETHEUS = Tool("prometheus", "github.com/prometheus/prometheus", (
    ("promtool", "github.com/prometheus/prometheus/cmd/promtool"),))
TOOLS_BUILT = (ETCD, KUBERNETES, KUBERNETES_OLDEST, PROMETHEUS)


@dataclass(frozen=True)
class Instance:
    """One control plane: the current release with a controller-manager (the whole suite), or the
    oldest release the README claims, API server only (the CRD and chart checks)."""

    name: str
    kubernetes: Tool
    controller_manager: bool

    @property
    def state_dir(self) -> Path:
        return ROOT / (".e2e" if self.name == "current" else f".e2e-{self.name}")


CURRENT = Instance("current", KUBERNETES, controller_manager=True)
OLDEST = Instance("oldest", KUBERNETES_OLDEST, controller_manager=False)


class BuildError(RuntimeError):
    """A tool failed to build; the message names the module, its version and the output's tail."""


def pinned_version(tool: Tool) -> str:
    """The version `tool.pin` is required at in its go.mod."""
    for line in (TOOLS / tool.module / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[-2] == tool.pin:
            return words[-1]
    raise BuildError(f"e2e/tools/{tool.module}/go.mod does not require {tool.pin}")


def _go_version() -> str:
    try:
        out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"the e2e control plane is built with Go, which is not usable here: {exc}. "
                         "Install Go 1.24+ (the module proxy must be reachable).") from exc
    return out.stdout.strip()


def build_dir(tool: Tool, go_version: str) -> Path:
    """Where this pin's binaries are cached."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((TOOLS / tool.module / name).read_bytes())
    digest.update(go_version.encode())
    digest.update(repr(tool.commands).encode())
    digest.update(_ldflags(tool).encode())
    return CACHE / f"{tool.module}-{pinned_version(tool)}-{digest.hexdigest()[:12]}"


def _ldflags(tool: Tool) -> str:
    """Strip symbols; stamp a Kubernetes build with its release, as the release build does (a
    `go build` says v0.0.0-master, which fails helm's kubeVersion check)."""
    flags = "-s -w"
    if tool.pin == "k8s.io/kubernetes":
        version = pinned_version(tool)
        major, minor = version.lstrip("v").split(".")[:2]
        stamp = "k8s.io/component-base/version"
        flags += (f" -X {stamp}.gitVersion={version} -X {stamp}.gitMajor={major}"
                  f" -X {stamp}.gitMinor={minor} -X {stamp}.gitTreeState=clean")
    return flags


def build(tool: Tool, go_version: str, log: bool = True) -> Path:
    """The folder holding the tool's binaries, built unless cached."""
    target = build_dir(tool, go_version)
    names = [name for name, _ in tool.commands]
    if all((target / n).is_file() for n in names):
        return target
    version = pinned_version(tool)
    if log:
        print(f"e2e: building {tool.pin} {version} ({', '.join(names)}); cached in {target}",
              file=sys.stderr, flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        out = Path(tmp) / "bin"
        out.mkdir()
        for name, package in tool.commands:
            result = subprocess.run(
                ["go", "build", "-buildvcs=false", "-trimpath", f"-ldflags={_ldflags(tool)}",
                 "-o", str(out / name), package],
                cwd=TOOLS / tool.module, capture_output=True, text=True)
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
                raise BuildError(f"building {package} from {tool.pin} {version} "
                                 f"(e2e/tools/{tool.module}) failed:\n{tail}")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    # Builds of earlier pins are never used again ("-v": kubernetes-v* is not kubernetes-oldest-v*).
    for stale in CACHE.glob(f"{tool.module}-v*"):
        if stale != target:
            shutil.rmtree(stale, ignore_errors=True)
    if log:
        print(f"e2e: built {tool.pin} {version} in {time.monotonic() - started:.0f} s",
              file=sys.stderr, flush=True)
    return target


def cached(tool: Tool, name: str) -> Path | None:
    """`name` from `tool` when `build` has made it for this pin and Go, else None (never builds)."""
    try:
        path = build_dir(tool, _go_version()) / name
    except BuildError:
        return None
    return path if path.is_file() else None


def build_all(tools: tuple[Tool, ...] = TOOLS_BUILT) -> dict[str, dict[str, Path]]:
    """{tool module: {binary name: path}}, building what is not cached."""
    go_version = _go_version()
    return {tool.module: {path.name: path for path in build(tool, go_version).iterdir()} for tool in tools}


# ---------------------------------------------------------------------------------------------
# certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(pki: Path, name: str, subject: str, sans: str | None = None, server: bool = False) -> None:
    """A key and a certificate signed by the CA in `pki`."""
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    ext = pki / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment",
             f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}"]
    if sans:
        lines.append(f"subjectAltName={sans}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "30", "-sha256", "-extfile", ext.name, "-out", f"{name}.crt",
             cwd=pki)


def make_pki(pki: Path) -> None:
    """CA, serving certificate, admin and controller-manager client certificates, SA key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=vgpu-e2e-ca", cwd=pki)
    _issue(pki, "apiserver", "/CN=kube-apiserver",
           "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc", server=True)
    _issue(pki, "admin", "/O=system:masters/CN=e2e-admin")
    _issue(pki, "controller-manager", "/CN=system:kube-controller-manager")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig(server: str, pki: Path, user: str) -> str:
    """A kubeconfig for `user` (a client certificate in `pki`)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                  "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate": str(pki / f"{user}.crt"),
                                          "client-key": str(pki / f"{user}.key")}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }, indent=2)


AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""


# ---------------------------------------------------------------------------------------------
# processes


@dataclass
class State:
    """What `up` started: enough for `down` to stop exactly that, and for tests to connect."""

    server: str
    kubeconfig: str
    audit_log: str
    ca: str
    pids: dict[str, int]
    kubernetes: str
    etcd: str
    # Each process's start time (/proc/PID/stat): a pid reused after a reboot is not ours to stop.
    starts: dict[str, int] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces


def _ours(state: State, name: str) -> bool:
    """The process `up` started under this name is still the one running with its pid."""
    pid = state.pids.get(name)
    return pid is not None and _alive(pid) and _start_time(pid) == state.starts.get(name, _start_time(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def admin_context(state: State) -> ssl.SSLContext:
    """TLS as the admin: the server checked against the CA, the admin client certificate."""
    pki = Path(state.ca).parent
    context = ssl.create_default_context(cafile=state.ca)
    context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return context


def _answers(state: State, path: str) -> bool:
    """GET `path` as the admin answers 200."""
    try:
        with urllib.request.urlopen(f"{state.server}{path}", context=admin_context(state), timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _ready(state: State) -> bool:
    return _answers(state, "/readyz")


def load_state(instance: Instance = CURRENT) -> State | None:
    """The running control plane's state, or None when none runs."""
    path = instance.state_dir / "state.json"
    if not path.exists():
        return None
    state = State(**json.loads(path.read_text()))
    if all(_ours(state, name) for name in state.pids) and _ready(state):
        return state
    return None


def _start(name: str, argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    # Own session: `down` stops the process group, and a test's Ctrl-C does not reach it.
    with (logs / f"{name}.log").open("ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(what: str, check: object, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"{what} exited with {proc.returncode}; {log}:\n{tail}")
        if callable(check) and check():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s; see {log}")


def up(instance: Instance = CURRENT) -> State:
    """Start etcd, kube-apiserver and (current) kube-controller-manager; reuse them when running."""
    running = load_state(instance)
    if running is not None:
        return running
    down(instance)  # a stale state (a crashed process): stop what is left of it
    built = build_all((ETCD, instance.kubernetes))
    binaries = {**built[ETCD.module], **built[instance.kubernetes.module]}
    state_dir = instance.state_dir
    shutil.rmtree(state_dir, ignore_errors=True)
    pki, logs, data = state_dir / "pki", state_dir / "logs", state_dir / "etcd"
    logs.mkdir(parents=True)
    make_pki(pki)
    (state_dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    server = f"https://127.0.0.1:{api_port}"
    pids: dict[str, int] = {}
    state = State(server=server, kubeconfig=str(state_dir / "kubeconfig"),
                  audit_log=str(state_dir / "audit.log"), ca=str(pki / "ca.crt"), pids=pids,
                  kubernetes=pinned_version(instance.kubernetes), etcd=pinned_version(ETCD))
    try:
        etcd = _start("etcd", [
            str(binaries["etcd"]), "--data-dir", str(data), "--name", "e2e",
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"e2e=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"], logs)
        pids["etcd"] = etcd.pid
        state.starts["etcd"] = _start_time(etcd.pid) or 0

        def etcd_ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{etcd_port}/health", timeout=1) as r:
                    return b'"true"' in r.read()
            except OSError:
                return False

        _wait("etcd", etcd_ready, etcd, logs / "etcd.log", 30)
        apiserver = _start("kube-apiserver", [
            str(binaries["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/24", "--allow-privileged=true",
            # etcd history is compacted every 10 s (5 min by default): a watch from an old
            # resourceVersion gets its 410 within seconds, as on a busy cluster.
            "--etcd-compaction-interval=10s",
            f"--audit-policy-file={state_dir / 'audit-policy.yaml'}", f"--audit-log-path={state.audit_log}",
            "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s", "--audit-log-batch-buffer-size=100000",
            "--audit-log-maxsize=0"], logs)
        pids["kube-apiserver"] = apiserver.pid
        state.starts["kube-apiserver"] = _start_time(apiserver.pid) or 0
        _wait("kube-apiserver", lambda: _ready(state), apiserver, logs / "kube-apiserver.log", 90)
        Path(state.kubeconfig).write_text(kubeconfig(server, pki, "admin"))
        if not instance.controller_manager:
            (state_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
            return state
        kcm_config = state_dir / "controller-manager.kubeconfig"
        kcm_config.write_text(kubeconfig(server, pki, "controller-manager"))
        kcm = _start("kube-controller-manager", [
            str(binaries["kube-controller-manager"]), f"--kubeconfig={kcm_config}",
            f"--authentication-kubeconfig={kcm_config}", f"--authorization-kubeconfig={kcm_config}",
            "--bind-address=127.0.0.1", f"--secure-port={_free_port()}", "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",  # each controller its own RBAC, as kubeadm runs it
            # no cloud, no nodes that run anything: keep to the controllers a cluster user relies on
            "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-route,-service,"
            "-persistentvolume-binder,-attachdetach,-persistentvolume-expander"], logs)
        pids["kube-controller-manager"] = kcm.pid
        state.starts["kube-controller-manager"] = _start_time(kcm.pid) or 0
        (state_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
        _wait("kube-controller-manager", lambda: _has_default_sa(state), kcm,
              logs / "kube-controller-manager.log", 60)
    except BaseException:
        (state_dir / "state.json").write_text(json.dumps(asdict(state), indent=2))
        down(instance)
        raise
    return state


def _has_default_sa(state: State) -> bool:
    """The controller-manager is working once it made the `default` ServiceAccount."""
    return _answers(state, "/api/v1/namespaces/default/serviceaccounts/default")


def down(instance: Instance = CURRENT) -> None:
    """Stop the processes recorded in the instance's state.json (and only those); remove it."""
    path = instance.state_dir / "state.json"
    if not path.exists():
        return
    state = State(**json.loads(path.read_text()))
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        pid = state.pids.get(name)
        if pid and _ours(state, name):
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                continue
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
    path.unlink()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: `up` ran in another process
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.controlplane", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "up", "down", "status"])
    parser.add_argument("--oldest", action="store_true",
                        help="the oldest supported kube-apiserver (API server only), not the current")
    args = parser.parse_args(argv)
    instance = OLDEST if args.oldest else CURRENT
    try:
        if args.command == "build":
            for module, binaries in build_all().items():
                for name, path in sorted(binaries.items()):
                    print(f"{module}/{name}: {path}")
        elif args.command == "up":
            started = time.monotonic()
            state = up(instance)
            print(f"e2e: kube-apiserver {state.kubernetes} at {state.server} "
                  f"({time.monotonic() - started:.1f} s); KUBECONFIG={state.kubeconfig}")
        elif args.command == "down":
            down(instance)
        else:
            running = load_state(instance)
            print(f"running: {running.server}" if running else "not running")
            return 0 if running else 1
    except BuildError as exc:
        print(f"e2e: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
