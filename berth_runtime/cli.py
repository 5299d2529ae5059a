"""`berth` inside a job: the CLI calls a job may make, relayed by its worker.

Submit, show, wait for and cancel jobs of the job's own tenant, put and get artifacts, and ask
for approval (exit 0 approved, 1 denied or timed out); the server signs them `job:<id>`.
Anything else is refused here, and again by the server.
"""

import argparse
import json
import sys
import time

from berth_runtime.relay import RelayError, api, load_artifact, request_approval, save_artifact

TERMINAL = {"succeeded": 0, "failed": 1, "cancelled": 130, "timed_out": 124}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berth", description="berth, from inside a job")
    sub = p.add_subparsers(dest="group", required=True)
    job = sub.add_parser("job").add_subparsers(dest="action", required=True)
    s = job.add_parser("submit")
    s.add_argument("--kind", default="default")
    s.add_argument("--pool")
    s.add_argument("--label", action="append", default=[])
    s.add_argument("--env", action="append", default=[], metavar="K=V")
    s.add_argument("--timeout", type=float, default=0.0)
    s.add_argument("--max-attempts", type=int, default=3)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--wait", action="store_true")
    s.add_argument("command", nargs=argparse.REMAINDER)
    for name in ("show", "wait", "cancel"):
        c = job.add_parser(name)
        c.add_argument("id", type=int)
        c.add_argument("--json", action="store_true")
    ls = job.add_parser("list")
    ls.add_argument("--state")
    cas = sub.add_parser("cas").add_subparsers(dest="action", required=True)
    cas.add_parser("put").add_argument("file")
    g = cas.add_parser("get")
    g.add_argument("ref")
    g.add_argument("out", nargs="?")
    approval = sub.add_parser("approval").add_subparsers(dest="action", required=True)
    r = approval.add_parser("request", help="ask a person's yes; wait for the answer")
    r.add_argument("title")
    r.add_argument("--details", default="")
    return p


def wait(job_id: int) -> int:
    delay = 0.1
    while True:
        shown = api("GET", f"/api/v1/jobs/{job_id}")
        if shown["state"] in TERMINAL:
            if shown["state"] == "failed" and shown.get("exit_code"):
                return int(shown["exit_code"])
            return TERMINAL[shown["state"]]
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def run(args: argparse.Namespace) -> int:
    if args.group == "approval":
        approved = request_approval(args.title, args.details)
        print("approved" if approved else "denied")
        return 0 if approved else 1
    if args.group == "cas":
        if args.action == "put":
            print(save_artifact(args.file))
            return 0
        if args.out:
            load_artifact(args.ref, args.out)
            return 0
        path = load_artifact(args.ref, f".berth-get-{args.ref[:16]}")
        sys.stdout.buffer.write(path.read_bytes())
        path.unlink()
        return 0
    if args.action == "submit":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise RelayError("no command: berth job submit [options] -- COMMAND [ARG...]")
        env = dict(item.partition("=")[::2] for item in args.env)
        body = {
            "command": command,
            "kind": args.kind,
            "labels": args.label,
            "env": env,
            "timeout_seconds": args.timeout,
            "max_attempts": args.max_attempts,
            "priority": args.priority,
        }
        if args.pool:
            body["pool"] = args.pool
        job = api("POST", "/api/v1/jobs", body)
        print(job["id"])
        return wait(job["id"]) if args.wait else 0
    if args.action == "list":
        query = f"?state={args.state}" if args.state else ""
        print(json.dumps(api("GET", f"/api/v1/jobs{query}"), indent=2))
        return 0
    if args.action == "wait":
        return wait(args.id)
    if args.action == "cancel":
        print(api("POST", f"/api/v1/jobs/{args.id}/cancel")["state"])
        return 0
    shown = api("GET", f"/api/v1/jobs/{args.id}")
    print(json.dumps(shown, indent=2) if args.json else f"{shown['id']} {shown['state']}")
    return 0


def main() -> None:
    args = parser().parse_args()
    try:
        code = run(args)
    except (RelayError, OSError) as exc:
        sys.stderr.write(f"berth: error: {exc}\n")
        code = 2
    raise SystemExit(code)


if __name__ == "__main__":
    main()
