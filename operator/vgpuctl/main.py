"""`vgpuctl` (also `kubectl vgpu`): render, diff, doctor, import and the demo.

Every command reads its input (a policy file, manifests given with -f/--cluster-dir, or a live
cluster through the kubeconfig), calls the pure core, and prints: tables for people, `-o json` or
`-o yaml` for scripts. Exit codes: 0 fine, 1 problems found (doctor) or changes pending (diff),
2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgpuctl import output
from vgpuctl.manifests import ManifestError, Prefilter, load_objects

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def read_objects(args: argparse.Namespace, prefilter: Prefilter | None = None) -> list[dict[str, Any]]:
    """Manifests from -f/--cluster-dir (later overlay earlier), else the live cluster."""
    sources: list[str] = list(getattr(args, "sources", None) or [])
    if sources:
        try:
            return load_objects([Path(s) for s in sources], prefilter)
        except ManifestError as err:
            raise UsageError(str(err)) from err
    from vgpuctl.live import ClusterError, read_cluster_sync  # imported late: only live reads need it

    try:
        return read_cluster_sync(args.kubeconfig, args.context)
    except ClusterError as err:
        raise UsageError(str(err)) from err


def _add_sources(parser: argparse.ArgumentParser, *, policy: bool) -> None:
    cluster = parser.add_argument_group("cluster (manifests, else the kubeconfig's cluster)")
    cluster.add_argument("--cluster-dir", "-c", dest="sources", action="append", metavar="PATH",
                         help="manifest file or directory; repeat it, later objects replace earlier ones "
                              "with the same kind/namespace/name")
    if policy:
        parser.add_argument("-f", "--filename", dest="policy", metavar="FILE",
                            help="VGPUPolicy YAML (default: the VGPUPolicy found in the cluster)")
    else:
        cluster.add_argument("-f", "--filename", dest="sources", action="append", metavar="PATH",
                             help="same as --cluster-dir")
    cluster.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    cluster.add_argument("--context", help="kubeconfig context")


def _add_output(parser: argparse.ArgumentParser, default: str = "table") -> None:
    parser.add_argument("-o", "--output", choices=output.FORMATS, default=default,
                        help=f"output format (default {default})")
    colour = parser.add_mutually_exclusive_group()
    colour.add_argument("--color", dest="color", action="store_true", default=None, help="force colour")
    colour.add_argument("--no-color", dest="color", action="store_false", help="no colour")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=parser_prog(),
        description="Explain, compare and adopt the Volcano + HAMi vGPU configuration of a cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = sub.add_parser("render", help="print the objects a VGPUPolicy renders (the four places and "
                                           "the scheduler Deployment it restarts)")
    _add_sources(render, policy=True)
    _add_output(render, default="yaml")

    diff = sub.add_parser("diff", help="what the operator would change, as a unified diff per object")
    _add_sources(diff, policy=True)
    _add_output(diff)

    doctor = sub.add_parser("doctor", help="find every inconsistency across the four places, nodes and pods")
    _add_sources(doctor, policy=False)
    doctor.add_argument("--pod", metavar="NS/NAME", help="explain this pod too")
    _add_output(doctor)

    imp = sub.add_parser("import", help="write a VGPUPolicy equivalent to what the cluster runs today")
    _add_sources(imp, policy=False)
    imp.add_argument("--name", default="default", help="metadata.name of the policy (default: default)")
    _add_output(imp, default="yaml")

    demo = sub.add_parser("demo", help="the whole chain on an embedded cluster, no real cluster needed")
    demo.add_argument("--no-hook", action="store_true", help="skip the libvgpu.so step")
    _add_output(demo)
    return parser


def parser_prog() -> str:
    return "kubectl vgpu" if Path(sys.argv[0]).name.startswith("kubectl-") else "vgpuctl"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    style = output.Style(output.use_colour(sys.stdout, getattr(args, "color", None)))
    try:
        if args.command == "doctor":
            from vgpuctl.commands import doctor_command
            from vgpuctl.doctor import DoctorPrefilter

            return doctor_command(args, read_objects(args, DoctorPrefilter(args.pod)), style)
        if args.command == "render":
            from vgpuctl.commands import render_command

            live = args.sources or args.kubeconfig
            return render_command(args, read_objects(args) if live else [], style)
        if args.command == "diff":
            from vgpuctl.commands import diff_command

            return diff_command(args, read_objects(args), style)
        if args.command == "import":
            from vgpuctl.commands import import_command

            return import_command(args, read_objects(args), style)
        from vgpuctl.demo import run_demo

        return run_demo(args, style)
    except UsageError as err:
        print(f"{parser_prog()} {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vgpuctl diff | head`: the reader left, which is fine
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
