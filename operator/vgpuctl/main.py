"""`vgpuctl` (also `kubectl vgpu`): render, diff, doctor, import, the demo and shell completion.

Every command reads its input (manifests given with -f, or a live cluster through the
kubeconfig), calls the pure core, and prints: tables for people, `-o json` or `-o yaml` for
scripts. Exit codes: 0 fine, 1 problems found (doctor) or changes pending (diff), 2 bad input,
always reported in one line: `vgpuctl <command>: <problem and fix>`.

Flags mean the same in every command, as in kubectl: `-f/--filename` names manifests (files or
directories; `-c/--cluster-dir` is the older spelling), `--policy` the VGPUPolicy file that
render and diff render, and `--version`, `--log-level`, `--log-format`, `-v` come from
`vgpu_formats.cli` like in every other program of the project.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from vgpu_formats.cli import add_common_flags, configure_logging, log_level

from vgpuctl import output
from vgpuctl.errors import EXIT_OK, EXIT_USAGE, UsageError
from vgpuctl.manifests import ManifestError, Prefilter, iter_file, load_objects

# The VGPUPolicy kind (vgpu_operator.api.KIND), spelled here so `--help` imports no operator code.
POLICY_KIND = "VGPUPolicy"
# A policy file is small; a bigger -f file is taken for manifests without being parsed twice.
POLICY_FILE_BYTES = 256 * 1024


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line too: `vgpuctl import: <what>; see ...`, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see `{self.prog} --help`\n")


def _exists(path: str, flag: str = "") -> Path:
    found = Path(path).expanduser()
    if not found.exists():
        raise UsageError(f"{flag + ' ' if flag else ''}{path}: no such file or directory")
    return found


def take_policy_file(args: argparse.Namespace) -> None:
    """render/diff: a -f file holding nothing but a VGPUPolicy is the policy (as --policy), so
    `vgpuctl diff -f policy.yaml` diffs it against the kubeconfig's cluster, like `kubectl diff -f`."""
    sources: list[str] = list(args.sources or [])
    if args.policy is not None:
        _exists(args.policy, "--policy")
        return
    policies = []
    for source in sources:
        path = _exists(source)
        if path.is_file() and path.stat().st_size <= POLICY_FILE_BYTES:
            try:
                kinds = {obj.get("kind") for obj in iter_file(path)}
            except ManifestError as err:
                raise UsageError(str(err)) from err
            if kinds == {POLICY_KIND}:
                policies.append(source)
    if len(policies) > 1:
        raise UsageError(f"{' and '.join(policies)} each hold only a VGPUPolicy: pass the one to render "
                         f"with --policy and the others with -f")
    if policies:
        args.policy = args.policy_from_f = policies[0]
        args.sources = [s for s in sources if s != policies[0]]


def read_objects(args: argparse.Namespace, prefilter: Prefilter | None = None) -> list[dict[str, Any]]:
    """Manifests from -f (later overlay earlier), else the live cluster."""
    sources: list[str] = list(getattr(args, "sources", None) or [])
    if sources:
        args.read_from = "the manifests given with -f"
        try:
            return load_objects([_exists(s) for s in sources], prefilter)
        except ManifestError as err:
            raise UsageError(str(err)) from err
    from vgpuctl.live import ClusterError, read_cluster_sync  # imported late: only live reads need it

    args.read_from = "the cluster"
    try:
        return read_cluster_sync(args.kubeconfig, args.context)
    except ClusterError as err:
        # The user may have meant a file to be the input: say what -f did, and that it is the other way.
        taken = getattr(args, "policy_from_f", None)
        why = f"{taken} holds only a VGPUPolicy, taken as --policy; " if taken else ""
        raise UsageError(f"{err} ({why}or read manifests instead of a cluster with -f PATH)") from err


def _add_sources(parser: argparse.ArgumentParser, *, policy: bool = False, offline: bool = False) -> None:
    source = parser.add_argument_group("input (manifests, else the kubeconfig's cluster)")
    source.add_argument("-f", "--filename", "-c", "--cluster-dir", dest="sources", action="append",
                        metavar="PATH", help="manifest file or directory instead of a live cluster; repeat "
                        "it, later objects replace earlier ones with the same kind/namespace/name")
    if policy:
        source.add_argument("--policy", metavar="FILE", help="the VGPUPolicy to render (default: the one "
                            "VGPUPolicy in the input; a -f file holding only a VGPUPolicy is taken as this)")
    if offline:
        # render works offline: a cluster only when asked for, so the help names no default file.
        source.add_argument("--kubeconfig", metavar="FILE", help="render against this cluster's live "
                            "objects (render reads a cluster only with -f, --kubeconfig or --context)")
        source.add_argument("--context", help="render against this kubeconfig context (of $KUBECONFIG or "
                            "~/.kube/config when --kubeconfig is not given)")
    else:
        source.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to read the cluster with "
                            "(default: the first file in $KUBECONFIG, else ~/.kube/config, else the pod's "
                            "service account)")
        source.add_argument("--context", help="kubeconfig context (default: its current-context)")


def _add_output(parser: argparse.ArgumentParser, default: str = "table",
                formats: Sequence[str] = output.FORMATS) -> None:
    parser.add_argument("-o", "--output", choices=formats, default=default,
                        help=f"output format (default {default})")
    colour = parser.add_mutually_exclusive_group()
    colour.add_argument("--color", dest="color", action="store_true", default=None, help="force colour")
    colour.add_argument("--no-color", dest="color", action="store_false", help="no colour")


def _common_anywhere(prog: str) -> Parser:
    """The common flags for each subcommand too (`vgpuctl doctor -v`, as kubectl takes them). No
    defaults here: a subcommand's default would overwrite the same flag given before it."""
    parent = Parser(prog=prog, add_help=False)
    add_common_flags(parent)
    for action in parent._actions:
        action.default = argparse.SUPPRESS
    return parent


def build_parser() -> argparse.ArgumentParser:
    prog = parser_prog()
    parser = Parser(prog=prog, description="Explain, compare and adopt the Volcano + HAMi vGPU "
                                           "configuration of a cluster.")
    add_common_flags(parser)
    parser.set_defaults(log_level="warning")  # a CLI speaks through its output; logs only when asked
    common = [_common_anywhere(prog)]
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = sub.add_parser("render", parents=common, help="print the objects a VGPUPolicy renders (the "
                            "four places and the scheduler Deployment it restarts)")
    _add_sources(render, policy=True, offline=True)
    _add_output(render, default="yaml")

    diff = sub.add_parser("diff", parents=common, help="what the operator would change, as a unified "
                                                       "diff per object")
    _add_sources(diff, policy=True)
    _add_output(diff)

    doctor = sub.add_parser("doctor", parents=common, help="find every inconsistency across the four "
                                                           "places, nodes and pods")
    _add_sources(doctor)
    doctor.add_argument("--pod", metavar="NS/NAME", help="explain this pod too")
    _add_output(doctor)

    imp = sub.add_parser("import", parents=common, help="write a VGPUPolicy equivalent to what the "
                                                        "cluster runs today")
    _add_sources(imp)
    imp.add_argument("--name", default="default", help="metadata.name of the policy (default: default)")
    # A policy is a document to save and apply, not rows: no table.
    _add_output(imp, default="yaml", formats=("yaml", "json"))

    demo = sub.add_parser("demo", parents=common, help="the whole chain on an embedded cluster, no real "
                                                       "cluster needed")
    demo.add_argument("--no-hook", action="store_true", help="skip the libvgpu.so step")
    _add_output(demo)

    completion = sub.add_parser("completion", parents=common, help="print a shell completion script: "
                                "source <(vgpuctl completion bash)")
    completion.add_argument("shell", choices=("bash", "zsh"))
    return parser


def parser_prog() -> str:
    return "kubectl vgpu" if Path(sys.argv[0]).name.startswith("kubectl-") else "vgpuctl"


def _run(args: argparse.Namespace, style: output.Style) -> int:
    if args.command == "doctor":
        from vgpuctl.commands import doctor_command
        from vgpuctl.doctor import DoctorPrefilter

        return doctor_command(args, read_objects(args, DoctorPrefilter(args.pod)), style)
    if args.command == "render":
        from vgpuctl.commands import render_command

        take_policy_file(args)
        live = args.sources or args.kubeconfig or args.context
        args.read_from = None  # an offline render reads nothing but --policy
        return render_command(args, read_objects(args) if live else [], style)
    if args.command == "diff":
        from vgpuctl.commands import diff_command

        take_policy_file(args)
        return diff_command(args, read_objects(args), style)
    if args.command == "import":
        from vgpuctl.commands import import_command

        return import_command(args, read_objects(args), style)
    if args.command == "completion":
        from vgpuctl.completion import script

        output.write(script(build_parser(), args.shell))
        return EXIT_OK
    try:
        from vgpuctl.demo import run_demo
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if (err.name or "").endswith(("_pb2", "_pb2_grpc")):  # generated, not in git (.gitignore)
            raise UsageError(f"the gRPC stubs ({err.name}) were never generated: run `make proto` in "
                             f"the source tree, then pip install . again") from err
        if not top or top.startswith("vgpu"):  # our own code missing is a bug, not a setup step
            raise
        # kmock (the API emulator) is a base dependency; an install that skipped it gets the fix.
        raise UsageError(f"the demo needs the Python module {top!r}, which this install lacks: "
                         f"pip install {top}") from err
    return run_demo(args, style)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(log_level(args), args.log_format)
    style = output.Style(output.use_colour(sys.stdout, getattr(args, "color", None)))
    try:
        return _run(args, style)
    except UsageError as err:
        problem = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"{parser_prog()} {args.command}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vgpuctl diff | head`: the reader left, which is fine
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
