"""The job that tests/e2e/test_many_hosts.py runs across network namespaces, as scripts a host runs.

``python many_hosts_job.py upload ...`` (on the S3 host) copies the example corpus into SeaweedFS;
``torchrun ... many_hosts_job.py train ...`` (on the trainer hosts) is one trainer rank: it builds
the plan itself from the corpus's S3 URL (the test process cannot reach the S3 host), joins a gloo
group across the two trainer hosts, and writes every batch it receives (sample ids and a token
hash) as one JSON line to a result file on its own host's private /tmp.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

from fault_trainer import token_hash  # noqa: E402  (tests/cluster: one hash for every fault test)

SOURCES = ("chat", "code")
STEPS = 10
DP = 2


def plan_for(sources):
    """The plan of the multi-host job over ``sources`` (the example corpus's chat and code)."""
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan

    chosen = [s for s in sources if s.name in SOURCES]
    return (Plan(chosen).mix({name: 1.0 for name in SOURCES}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=DP)).seed(7))


def record(batch) -> dict:
    """What the test compares: the step, the sample ids and a hash of the tokens."""
    return {"step": int(batch["step"]), "sample_ids": batch["sample_ids"].tolist(),
            "tokens": token_hash(batch)}


def storage_options(endpoint: str) -> dict:
    return {"anon": True, "client_kwargs": {"endpoint_url": endpoint}}


def upload(args: argparse.Namespace) -> int:
    """Wait (bounded) for the S3 server, then copy ``--corpus`` into ``--url`` and delete the copy."""
    import shutil
    import urllib.request

    import s3fs

    deadline = time.monotonic() + args.timeout
    while True:
        try:
            with urllib.request.urlopen(args.endpoint + "/", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"S3 at {args.endpoint} did not answer within {args.timeout}s")
            time.sleep(0.2)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options(args.endpoint))
    bucket, _, prefix = args.url.removeprefix("s3://").partition("/")
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    local = Path(args.corpus)
    for path in sorted(local.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            fs.put_file(str(path), f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}")
    shutil.rmtree(local)  # the S3 server holds the only copy
    print("uploaded", flush=True)
    return 0


def train(args: argparse.Namespace) -> int:
    """One torchrun rank: gloo across hosts, the mdata Loader, one JSON line per batch."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from mdata.data.example import example_sources
    from mdata.trainer import Loader

    security = None
    if args.tls_ca:
        from distributed.security import Security

        security = Security(tls_ca_file=args.tls_ca, tls_client_cert=args.tls_cert,
                            tls_client_key=args.tls_key, require_encryption=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    out = Path(args.out_dir) / f"rank-{rank}.jsonl"
    plan = plan_for(example_sources(args.url, storage_options=storage_options(args.endpoint)))
    try:
        with open(out, "w", encoding="utf-8") as f, \
                Loader(args.scheduler, job=args.job, plan=plan, steps=STEPS, timeout=120,
                       security=security) as loader:
            for batch in loader:
                f.write(json.dumps(record(batch)) + "\n")
                f.flush()
                dist.all_reduce(torch.tensor([float(len(batch["sample_ids"]))]))
                time.sleep(args.step_sleep)
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload")
    up.add_argument("--corpus", required=True)
    up.add_argument("--url", required=True)
    up.add_argument("--endpoint", required=True)
    up.add_argument("--timeout", type=float, default=60.0)
    tr = sub.add_parser("train")
    tr.add_argument("--scheduler", required=True)
    tr.add_argument("--job", required=True)
    tr.add_argument("--url", required=True)
    tr.add_argument("--endpoint", required=True)
    tr.add_argument("--out-dir", default="/tmp")
    tr.add_argument("--step-sleep", type=float, default=0.0)
    tr.add_argument("--tls-ca", default=None)
    tr.add_argument("--tls-cert", default=None)
    tr.add_argument("--tls-key", default=None)
    args = parser.parse_args(argv)
    return upload(args) if args.command == "upload" else train(args)


if __name__ == "__main__":
    sys.exit(main())
