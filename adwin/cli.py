"""``adwin`` command line. Each command lives in its own module exposing ``add_arguments(parser)``
and ``main(args) -> int``; modules keep heavy imports (torch, transformers) inside ``main`` so that
``--help`` stays fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

# (command path, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("train",), "adwin.train", "distill a student with adaptive prefix windows (built-in task by default)"),
    (("prepare",), "adwin.tasks.prepare", "build the built-in task's tokenizer, teacher(s) and student init"),
    (("controller", "serve"), "adwin.controller.serve", "serve the controller HTTP API and dashboard"),
    (("teacher", "serve"), "adwin.teacher_server.serve",
     "serve a teacher checkpoint over OpenAI-compatible completions (token-id prompt scoring)"),
    (("bench", "audit"), "adwin.bench.audit", "time and memory of the alignment audit methods"),
    (("bench", "audit-agreement"), "adwin.bench.audit_agreement",
     "top:N and debiased audits against the full one: decision agreement, cosine vs probe batch, skip replay"),
    (("bench", "controller"), "adwin.bench.controller", "latency and throughput of the controller service"),
    (("bench", "probes"), "adwin.bench.probes", "wall time of fixed vs ADWIN with inline, thread and Ray probe workers"),
    (("bench", "scale"), "adwin.bench.scale", "steps/s on 1 and 2 data-parallel processes, and the audit combine's cost"),
    (("bench", "memory"), "adwin.bench.memory",
     "peak memory per rank of a replicated (DDP) and a sharded (FSDP) student, and the largest student each fits"),
    (("bench", "eval"), "adwin.bench.evaluation", "evaluation cost: transformers' generate vs the compacting sampler"),
    (("bench", "compare"), "adwin.bench.compare.command", "every window method side by side: accuracy, tokens, FLOPs, time"),
    (("bench", "teacher"), "adwin.bench.teacher",
     "training steps/s with the teacher in process vs behind a server; the server's tokens/s under concurrent clients"),
    (("bench", "gpu"), "adwin.bench.gpu.command", "check a GPU setup and measure decode speed and ADWIN's overhead in 8 minutes"),
    (("bench", "audit-truth"), "adwin.bench.audit_truth",
     "each candidate window's population cosine at a checkpoint, what a probe batch reads, and the rule's replay"),
    (("bench", "curve"), "adwin.bench.compare.curve",
     "the learning curve of full-rollout OPD on a task: accuracy and line measures every few steps, with CIs"),
    (("bench", "async"), "adwin.bench.compare.asyncopd", "sync trainer vs AsyncOPD streaming: tokens/s, staleness, paired accuracy"),
]


class _Parser(argparse.ArgumentParser):
    """Usage mistakes print one line (``adwin train: error: ... (see adwin train --help)``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="adwin",
        description="ADWIN: on-policy distillation on adaptively chosen rollout prefixes, "
        "audited by delayed full-rollout probes.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, module, help_text in COMMANDS:
        subs = top
        for depth, name in enumerate(path[:-1]):
            key = " ".join(path[: depth + 1])
            if key not in groups:
                group_parser = subs.add_parser(name, help=f"{name} commands")
                groups[key] = group_parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
            subs = groups[key]
        mod = importlib.import_module(module)
        p = subs.add_parser(path[-1], help=help_text, description=(mod.__doc__ or help_text).strip())
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `adwin train --nproc N` relaunches it under torchrun
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # httpx logs one INFO line per request (remote controller, teacher servers)
        logging.getLogger("httpx").setLevel(logging.WARNING)
    mod = getattr(args, "_module", None)
    if mod is None:
        parser.print_help()
        return 2
    try:
        return int(mod.main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        code = exit_code(e)
        if code is None:
            raise  # a bug: keep the traceback
        logging.getLogger("adwin").debug("failed", exc_info=True)
        sys.stderr.write(f"adwin: error: {one_line(e)}\n")
        return code


def exit_code(e: Exception) -> int | None:
    """Exit code of an expected failure (bad input, unreachable controller or teacher, numerical fault); None for a bug."""
    import yaml

    from adwin.controller.api import ControllerError
    from adwin.runtime.guards import NumericalFault, TeacherOutage

    if isinstance(e, (NumericalFault, TeacherOutage)):  # the run stopped after a checkpoint to resume from
        return 3
    if isinstance(e, (ValueError, OSError, yaml.YAMLError, ControllerError)):
        return 2
    return None


def one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
