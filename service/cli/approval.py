"""`berth approval list | show ID | approve ID | deny ID`: answer what jobs ask.

A job asks from inside itself (`request_approval(title, details)` in Python, or its own `berth
approval request TITLE`, relayed by its worker) and blocks until a member of its tenant answers
here; with `[pools.P] approvals = "four-eyes"` (the default) that member is not the job's creator.
"""

import argparse
from typing import Any

from service.cli.client import Client, add_server_arg, listing, print_json

STATES = ("pending", "approved", "denied", "timed_out", "closed", "all")


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("approval", help="answer jobs' requests for approval")
    asub = p.add_subparsers(dest="approval_command", required=True, parser_class=type(p))
    ls = asub.add_parser("list", help="requests of your tenants' jobs (pending by default)")
    add_server_arg(ls)
    ls.add_argument("--state", choices=STATES, default="pending", help="default: pending")
    ls.add_argument("--job", type=int, metavar="ID", help="only this job's requests")
    ls.add_argument("--limit", type=int, default=100)
    ls.set_defaults(func=list_approvals)
    sh = asub.add_parser("show", help="one request: what the job asks, and the answer")
    add_server_arg(sh)
    sh.add_argument("id", type=int)
    sh.set_defaults(func=show)
    for name, approve in (("approve", True), ("deny", False)):
        a = asub.add_parser(
            name,
            help=f"{name} a pending request (a member of the job's tenant; with four-eyes, "
            "not the job's creator)",
        )
        add_server_arg(a)
        a.add_argument("id", type=int)
        a.add_argument("--reason", default="", help="why: kept with the answer and in the audit")
        a.set_defaults(func=answer, approve=approve)


def _line(a: dict[str, Any]) -> list[str]:
    return [
        str(a["id"]),
        a["state"],
        str(a["job"]),
        a["tenant"],
        a["created_at"][:19].replace("T", " "),
        a["deadline"][:19].replace("T", " "),
        a["answered_by"] or "-",
        a["title"],
    ]


def list_approvals(args: argparse.Namespace) -> int:
    found = Client(args.server).call(
        "GET",
        "/api/v1/approvals",
        state=None if args.state == "all" else args.state,
        job=args.job,
        limit=args.limit,
    )
    return listing(
        args,
        found,
        [_line(a) for a in found],
        ["ID", "STATE", "JOB", "TENANT", "ASKED (UTC)", "DEADLINE (UTC)", "ANSWERED BY", "TITLE"],
    )


def _print(a: dict[str, Any]) -> None:
    for key in (
        "id",
        "state",
        "job",
        "tenant",
        "pool",
        "policy",
        "title",
        "details",
        "job_creator",
        "created_at",
        "deadline",
        "answered_by",
        "answered_at",
        "reason",
    ):
        value = a.get(key)
        print(f"{key:12} {value if value not in (None, '') else '-'}")


def show(args: argparse.Namespace) -> int:
    found = Client(args.server).call("GET", f"/api/v1/approvals/{args.id}")
    if args.json:
        print_json(found)
    else:
        _print(found)
    return 0


def answer(args: argparse.Namespace) -> int:
    verb = "approve" if args.approve else "deny"
    out = Client(args.server).call(
        "POST", f"/api/v1/approvals/{args.id}/{verb}", {"reason": args.reason}
    )
    if args.json:
        print_json(out)
    else:
        print(f"approval {out['id']} {out['state']}: job {out['job']} ({out['title']})")
    return 0
