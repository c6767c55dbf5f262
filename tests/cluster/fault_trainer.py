"""Trainer process body for the chaos tests: a real process that can be ``kill -9``'d.

Run as a script (``python tests/cluster/fault_trainer.py --address ... --rank 0 ...``) by
:mod:`faults`, never through ``multiprocessing``: a test must be able to SIGKILL one trainer by its
own pid, as a crashing GPU host would, without taking the test process down with it.

What it writes, so a test can compare what every rank *trained on* with an uninterrupted run:

* ``--out`` (JSON Lines, flushed line by line so a SIGKILL loses at most the line being written):
  ``{"kind": "start", ...}`` once, then per batch ``{"kind": "batch", "step", "sample_ids",
  "tokens"}`` where ``tokens`` is a sha1 over every micro-batch's ``input_ids`` (shape, dtype and
  bytes), then ``{"kind": "checkpoint", "next_step", "path"}`` after each saved checkpoint, and
  ``{"kind": "done"}`` or ``{"kind": "error", "error"}`` at the end.
* ``--checkpoint-dir``: ``step-NNNNNN.json`` files holding ``loader.state_dict()`` after every
  ``--checkpoint-every`` steps (written to a temporary file and renamed, so a file that exists is
  complete). ``NNNNNN`` is the state's ``next_step``: the first step a resumed rank receives.

Data parallelism: with ``--dist-port`` (world size > 1) the ranks form a torch.distributed gloo
group and all-reduce once per step, as data-parallel training does. That keeps ranks in lock step,
so a fault lands at the same step for every rank and their checkpoints line up; and it is why a
killed rank cannot rejoin alone: the survivors' collectives fail, and the whole job restarts from
its last common checkpoint (the live-resume scenario). Without ``--dist-port`` ranks run
independently (one rank's death stalls the others only through the Planner's window).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path


def token_hash(batch: dict) -> str:
    """sha1 over the shape, dtype and bytes of each micro-batch's ``input_ids``, in order."""
    digest = hashlib.sha1()
    for mb in batch["micro_batches"] or ():
        ids = mb["input_ids"].contiguous().cpu().numpy()
        digest.update(f"{ids.dtype}{ids.shape};".encode())
        digest.update(ids.tobytes())
    return digest.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Log:
    """One JSON object per line, flushed at once: what a SIGKILL leaves behind is readable."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True, help="the mdata scheduler's address")
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--end-step", type=int, required=True, help="stop after the batch of step END-1")
    p.add_argument("--out", type=Path, required=True, help="JSON Lines log of what was received")
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--resume", type=Path, default=None, help="a state_dict JSON file to resume from")
    p.add_argument("--plan", type=Path, default=None,
                   help="a pickled Plan: the Loader registers the job (with --resume's checkpoint)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of simulated compute per step")
    p.add_argument("--timeout", type=float, default=60.0, help="the Loader's per-batch timeout")
    p.add_argument("--dist-port", type=int, default=None,
                   help="join a gloo group on 127.0.0.1:PORT and all-reduce each step")
    p.add_argument("--dist-timeout", type=float, default=60.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    state = json.loads(args.resume.read_text()) if args.resume is not None else None
    start = int(state["next_step"]) if state is not None else 0
    log.write(kind="start", pid=os.getpid(), rank=args.rank, start_step=start,
              resume=None if args.resume is None else str(args.resume), time=time.time())
    dist = None
    try:
        import torch

        if args.dist_port is not None and args.world_size > 1:
            import torch.distributed as dist

            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{args.dist_port}", rank=args.rank,
                world_size=args.world_size, timeout=timedelta(seconds=args.dist_timeout))
        from mdata.trainer import Loader

        plan = pickle.loads(args.plan.read_bytes()) if args.plan is not None else None
        with Loader(args.address, job=args.job, plan=plan, rank=args.rank,
                    world_size=args.world_size, steps=args.end_step - start,
                    timeout=args.timeout) as loader:
            if state is not None:
                loader.load_state_dict(state)
            for batch in loader:
                step = int(batch["step"])
                log.write(kind="batch", step=step, sample_ids=batch["sample_ids"].tolist(),
                          tokens=token_hash(batch), time=time.time())
                if dist is not None:  # the step's gradient all-reduce, in miniature
                    dist.all_reduce(torch.tensor([float(len(batch["sample_ids"]))]))
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                next_step = step + 1
                if next_step % args.checkpoint_every == 0:
                    path = args.checkpoint_dir / f"step-{next_step:06d}.json"
                    write_atomic(path, json.dumps(loader.state_dict()))
                    log.write(kind="checkpoint", next_step=next_step, path=str(path))
        log.write(kind="done", time=time.time())
        return 0
    except BaseException as exc:  # noqa: BLE001 - written down for the test, then a non-zero exit
        log.write(kind="error", error=f"{type(exc).__name__}: {exc}", type=type(exc).__name__,
                  time=time.time(), traceback=traceback.format_exc(limit=8))
        return 1
    finally:
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
