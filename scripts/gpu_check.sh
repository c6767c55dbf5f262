#!/usr/bin/env bash
# Check mdata on a machine with a CUDA GPU: the CUDA tests, then a short training loop through the
# Loader on the GPU, printing the host-to-device rate measured while landing batches.
#
#   bash scripts/gpu_check.sh              # uses .venv (bash scripts/setup.sh makes it)
#   STEPS=50 bash scripts/gpu_check.sh     # a longer loop
#
# The loop builds the small example corpus (needs the material scripts/setup.sh downloads, or
# MDATA_MATERIAL), or reads a built one from MDATA_CORPUS. Fails (exit 1) without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ ! -x "$py" ]; then
  echo "gpu_check: $py not found; run 'bash scripts/setup.sh' first (or set PYTHON)" >&2
  exit 1
fi
if ! "$py" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build "
          f"{torch.version.cuda or 'none'}); run this on a machine with an NVIDIA GPU and a CUDA "
          "build of torch", file=sys.stderr)
    sys.exit(1)
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
then
  exit 1
fi

echo "== CUDA tests (none may be skipped for want of CUDA)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/pytest.log"
set +e
"$py" -m pytest tests/unit/test_tensors.py tests/unit/test_client_device.py -q -rs -p no:cacheprovider \
  2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "gpu_check: the CUDA tests failed" >&2
  exit 1
fi
if grep -q "needs a CUDA device" "$log"; then
  echo "gpu_check: CUDA tests were skipped although CUDA is present" >&2
  exit 1
fi

echo "== training loop through mdata.trainer.Loader on cuda:0"
# The loop runs from a file: the embedded cluster spawns processes that re-import it.
loop="$work/gpu_loop.py"
cat > "$loop" <<'PY'
import logging
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from distributed import Client

from mdata.cost import AttentionCost
from mdata.data.example import build_example_corpus, example_sources
from mdata.driver import start_cluster, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader
from mdata.trainer.tensors import default_lander


def main() -> None:
    logging.getLogger("distributed").setLevel(logging.WARNING)
    steps = int(os.environ["STEPS"])
    device = torch.device("cuda", 0)
    image_token = 100_277  # past cl100k's vocabulary, as in mdata.driver.demo
    vocab = 4096  # a tiny model: token ids are folded into a small vocabulary

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(os.environ.get("MDATA_CORPUS") or Path(tmp) / "corpus")
        if not (corpus / "manifest.json").exists():
            build_example_corpus(corpus, size="small")
        sources = example_sources(corpus)
        plan = (Plan(sources).mix({s.name: 1.0 for s in sources})
                .cost(AttentionCost(a=1.0, b=4096.0))
                .balance(micro_batches=2, max_tokens=4096, global_batch=16)
                .distribute(ClientPlaceTree(dp=1))
                .special_tokens(pad_id=0, image_token_id=image_token)
                .seed(0))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, vocab)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, tokens = [], 0
        with start_cluster(sources, constructors=1) as cluster, \
                Client(cluster.scheduler_address, set_as_default=False, direct_to_workers=True) as client:
            submit_job(client, plan, job="gpu-check")
            began = time.monotonic()
            with Loader(client, job="gpu-check", rank=0, world_size=1, steps=steps, device=device,
                        timeout=120) as loader:
                for batch in loader:
                    optimizer.zero_grad(set_to_none=True)
                    loss_sum = torch.zeros((), device=device)
                    targets = torch.zeros((), device=device)
                    for mb in batch["micro_batches"]:
                        for name, tensor in mb.items():
                            want = "cpu" if name == "sample_ids" else "cuda"
                            assert tensor.device.type == want, (name, tensor.device)
                        labels = mb["labels"].long()
                        labels = torch.where(labels >= 0, labels % vocab, labels)
                        logits = model(mb["input_ids"].long() % vocab)
                        loss_sum = loss_sum + torch.nn.functional.cross_entropy(
                            logits, labels, ignore_index=-100, reduction="sum")
                        targets = targets + (labels != -100).sum()
                        tokens += int(mb["seqlens"].sum())
                    loss = loss_sum / targets.clamp(min=1)
                    loss.backward()
                    optimizer.step()
                    losses.append(float(loss))
                wall = time.monotonic() - began
                fetch = loader.fetch_seconds
            client.sync(client.scheduler.mdata_close_job, job="gpu-check", client=client.id)

    stats = default_lander(device).copy_stats()
    assert len(losses) == steps, f"trained {len(losses)} of {steps} steps"
    assert all(math.isfinite(x) for x in losses), losses
    print(f"gpu_check: {steps} steps, {tokens} tokens in {wall:.1f}s; loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}; Loader fetch+land {fetch:.2f}s")
    print(f"gpu_check: host-to-device while landing batches: {stats['bytes'] / 1e6:.1f} MB in "
          f"{stats['seconds'] * 1e3:.1f} ms = {stats['gb_per_s']:.2f} GB/s")
    if stats["bytes"] <= 0:
        raise SystemExit("gpu_check: no bytes were landed on the GPU")


if __name__ == "__main__":  # the cluster spawns worker processes that import this file
    main()
PY
DASK_LOGGING__DISTRIBUTED=${DASK_LOGGING__DISTRIBUTED:-warning} STEPS=${STEPS:-20} "$py" "$loop"
echo "gpu_check: OK"
