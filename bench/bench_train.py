#!/usr/bin/env python3
"""Training steps per second of the C engine's RAM trainer beside a PyTorch CPU training loop of the same
model, on the same batch, from the same weights; with --device cuda, of its VRAM trainer beside a PyTorch
bf16 training loop on the GPU.

    python3 bench/bench_train.py --build build [--threads 2] [--steps 10] [--warmup 2] [--large]
    python3 bench/bench_train.py --build build-gpu --device cuda [--steps 10] [--warmup 2] [--out FILE]

For each size (depth 2, hidden 128, context 64, 32 items; with --large also depth 4, hidden 256, 64
items), once with texts only and once with texts and 32 x 32 PNG images (patch 8; skipped, with the
reason, where bench_train was built without libspng):
  (a) `<build>/bench/bench_train --json --save-initial ... --save-batch ...`: a RAM trainer of
      --threads threads made from uform_trainer_config_default with those sizes, seeded; it saves the
      initial weights and the batch (random printable texts of --text-bytes bytes, PNGs; relations pair
      items 2k and 2k + 1), runs --warmup steps, then --steps timed steps;
  (b) PyTorch, torch.set_num_threads(threads) and as many OpenBLAS threads, float32, from the engine's
      F32 master weights (the `.optimizer` file beside the BF16 checkpoint):
      tests/reference/train_reference.py's model and loss (TrainModel, contrastive_loss, the same
      lm_weight) on that checkpoint and batch, with
      torch.optim.AdamW (the engine's learning rate, betas, epsilon and weight decay, decay on rank-2
      `*.weight` tensors only, the same warmup-then-cosine schedule, the same global-norm clipping; every
      tensor stepped every step, as the engine does). Each step prepares the items from their encoded
      form (Pillow decodes the PNGs), as the engine decodes them in each of its steps. The texts of a
      batch all keep the same number of bytes, so they go through the text tower as one [B, T] batch
      (the reference itself loops over texts one by one; --torch-per-item times that loop instead; the
      first run checks the batched loss against the reference's own).
Both time --steps steps after --warmup untimed ones. It prints steps/s, items/s and tokens/s (a text
counts its kept bytes and BOS, an image its patches and class token) of both and their ratio, and the
loss of the first and last step of both with their difference: the first steps start from the same
weights on the same batch, so their losses should agree to float32 rounding. It never fails on time.
Debian's PyTorch (BLAS_INFO=generic) does its float32 GEMMs through libblas.so.3, which the header line
names: the reference BLAS (libblas3) runs at about 4 GFLOP/s and the ratio then says more about it than
about PyTorch; with libopenblas0-pthread installed (as .ci/run does) it is the fair baseline.

With --device cuda (a CUDA device, and a PyTorch that can use it) the size is the base configuration instead:
depth 12, hidden 768 (mlp 3072), text context 64 (texts of 64 bytes), images 224 x 224 in patches of 16, a
batch of 256 items (128 texts and 128 images, PNGs), on bench_train --device cuda: the VRAM trainer. PyTorch
runs the same model, batch and starting weights on the GPU in float32 parameters under
torch.autocast(bfloat16), attention through F.scaled_dot_product_attention, fused AdamW where the PyTorch
has it, the same clipping and schedule; its items are decoded and moved to the GPU once, before the timed
steps (the engine decodes its PNGs in every step, on its host threads). Beside samples/s it prints the
model FLOPs of a step (6 x parameters x tokens for the linear layers, the LM head and the patch layer, and
attention's 12 x L^2 x hidden per layer and item, halved when causal) and each one's MFU against the device's
dense BF16 peak (989 TFLOP/s for H100 and H200; --peak-tflops for another), and the share of a step each
phase takes: for the engine, its host preparation (decoding and staging, up to the step's first progress
report) and the rest, on the device; for PyTorch, forward, backward and the optimizer (CUDA events). --out
appends the table to a file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import bench_common as common
from bench_common import ratio

if __name__ == "__main__":
    common.python_with(["torch", "numpy", "PIL"])
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train_reference as train_ref  # noqa: E402
import uform_reference as ref  # noqa: E402

BASE = {"depth": 12, "hidden": 768, "context": 64, "batch": 256}
BASE_IMAGE = {"image_size": 224, "image_patch": 16}
DIMS = 64  # uform_trainer_config_default's
PEAKS = {"H100": 989.4e12, "H200": 989.4e12}  # dense BF16 tensor-core FLOP/s (SXM)
SMALL = {"depth": 2, "hidden": 128, "context": 64, "batch": 32}
LARGE = {"depth": 4, "hidden": 256, "context": 64, "batch": 64}
IMAGE = {"image_size": 32, "image_patch": 8}


# ------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------


def run_engine(exe: Path, workdir: Path, size: dict, towers: str, args, image=None) -> tuple[dict | None, str]:
    """bench_train's JSON record (its checkpoint and batch saved under `workdir`), or None and the reason."""
    image = image or IMAGE
    tag = f"d{size['depth']}-h{size['hidden']}-b{size['batch']}-{towers.replace(',', '-')}-{args.device}"
    folder = workdir / tag
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "initial.safetensors"
    command = [str(exe), "--json", "--towers", towers, "--threads", str(args.threads), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--text-bytes", str(args.text_bytes), "--seed", str(args.seed),
               "--save-initial", str(checkpoint.resolve()), "--save-batch", str(folder)]
    for key in ("depth", "hidden", "context", "batch"):
        command += [f"--{key}", str(size[key])]
    for key, value in image.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    command += ["--device", args.device]
    ran = subprocess.run(command, capture_output=True, text=True)
    if ran.returncode != 0:
        return None, f"bench_train exited {ran.returncode}: {ran.stderr.strip()[-300:]}"
    record = json.loads(ran.stdout.strip().splitlines()[-1])
    record["batch_json"] = str(folder / "batch.json")
    record["command"] = " ".join(command)
    return record, ""


# ------------------------------------------------------------------------------------------------
# PyTorch
# ------------------------------------------------------------------------------------------------


def batched_embed(model: train_ref.TrainModel, prepared: list):
    """TrainModel.embed with the texts of each kept length stacked into one [n, T] forward (the reference
    runs them one at a time); the same (embeddings [B, dims], LM cross-entropy sum, positions)."""
    embeddings = [None] * len(prepared)
    model.embed_images(prepared, embeddings)
    lm_sum = torch.zeros((), dtype=model.dtype)
    lm_count = 0
    lengths = sorted({data.shape[0] for kind, data in prepared if kind == "text"})
    tower = model.towers.get("text")
    for length in lengths:
        rows = [i for i, (kind, data) in enumerate(prepared) if kind == "text" and data.shape[0] == length]
        ids = torch.stack([prepared[i][1] for i in rows])  # [n, 1 + kept]
        states = tower.forward(ids)  # [n, 1 + kept, hidden], final-normed
        for row, embedding in zip(rows, tower.embed_states(states[:, -1])):
            embeddings[row] = embedding
        kept = length - 1
        if kept:
            logits = states[:, :kept] @ tower.embed[: ref.BOS].T  # [n, kept, 256]
            lm_sum = lm_sum + F.cross_entropy(logits.reshape(-1, ref.BOS), ids[:, 1:].reshape(-1), reduction="sum")
            lm_count += kept * len(rows)
    if any(kind not in ("text", "image") for kind, _ in prepared):
        raise ValueError("bench_train makes texts and images only")
    return torch.stack(embeddings), lm_sum, lm_count


def losses(model: train_ref.TrainModel, prepared: list, relations: list, lm_weight: float, per_item: bool):
    if per_item:
        return model.losses(prepared, relations, lm_weight)
    embeddings, lm_sum, lm_count = batched_embed(model, prepared)
    contrastive = train_ref.contrastive_loss(embeddings, relations, model.matryoshka, model.logit_scale,
                                             model.logit_bias)
    lm = lm_sum / lm_count if lm_count else torch.zeros((), dtype=model.dtype)
    return contrastive + lm_weight * lm, contrastive, lm


def run_torch(record: dict, args, check: bool) -> dict:
    """The PyTorch loop on bench_train's checkpoint and batch: steps per second, per-step losses, and
    (when `check`) the difference of the first loss from the reference's own per-text loss."""
    common.torch_threads(args.threads)
    batch = train_ref.load_batch(record["batch_json"])
    config = batch.optimizer
    model = train_ref.TrainModel(batch.checkpoint, torch.float32)
    parameters = model.parameters
    # The inference checkpoint holds BF16 weights; the engine trains its F32 master weights, saved beside it.
    masters, _ = ref.read_safetensors(str(batch.checkpoint) + ".optimizer")
    with torch.no_grad():
        for name, p in parameters.items():
            p.copy_(torch.from_numpy(masters[f"value.{name}"].copy()).reshape(p.shape))
    decayed = [p for name, p in parameters.items() if train_ref.decays(name, p)]
    others = [p for name, p in parameters.items() if not train_ref.decays(name, p)]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": config.weight_decay},
                                   {"params": others, "weight_decay": 0.0}],
                                  lr=config.learning_rate, betas=(config.beta1, config.beta2), eps=config.epsilon)
    history = []
    check_difference = None
    if check:
        with torch.no_grad():
            prepared = model.prepare(batch.items)
            theirs = model.losses(prepared, batch.relations, batch.lm_weight)[0].item()
            ours = losses(model, prepared, batch.relations, batch.lm_weight, False)[0].item()
        check_difference = ours - theirs

    def step(number: int) -> None:
        optimizer.zero_grad(set_to_none=False)
        prepared = model.prepare(batch.items)  # decoded in every step, as the engine does
        loss, contrastive, lm = losses(model, prepared, batch.relations, batch.lm_weight, args.torch_per_item)
        loss.backward()
        with torch.no_grad():
            for p in parameters.values():
                if p.grad is None:  # a tensor the batch does not reach is still stepped (decayed)
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in parameters.values()]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads])).item()
            if config.clip_norm > 0 and norm > config.clip_norm:
                torch._foreach_mul_(grads, config.clip_norm / norm)
            for group in optimizer.param_groups:
                group["lr"] = train_ref.learning_rate(config, number)
            optimizer.step()
        history.append((loss.item(), contrastive.item(), lm.item()))

    for number in range(1, args.warmup + 1):
        step(number)
    start = time.perf_counter()
    for number in range(args.warmup + 1, args.warmup + args.steps + 1):
        step(number)
    seconds = time.perf_counter() - start
    rate = args.steps / seconds
    return {"steps_per_second": rate, "items_per_second": rate * len(batch.items),
            "tokens_per_second": rate * record["tokens_per_step"], "history": history, "check": check_difference}


# ------------------------------------------------------------------------------------------------
# On a GPU
# ------------------------------------------------------------------------------------------------


def step_flops(record: dict) -> float:
    """Model FLOPs of one training step of bench_train's batch (texts and images alternating)."""
    hidden, depth, batch = record["hidden"], record["depth"], record["batch"]
    mlp = 4 * hidden
    texts, images = (batch + 1) // 2, batch // 2
    text_length = 1 + min(record["text_bytes"], record["context"])
    side = record["image_size"] // record["image_patch"]
    image_length = 1 + side * side

    def tower(length: int, items: int, causal: bool) -> float:
        linear = 2 * (4 * hidden * hidden + 2 * hidden * mlp) * depth * length * items
        attention = 4 * length * length * hidden * depth * items * (0.5 if causal else 1.0)
        return linear + attention + 2 * hidden * DIMS * items

    forward = tower(text_length, texts, True) + 2 * 256 * hidden * text_length * texts
    forward += tower(image_length, images, False) + 2 * 3 * record["image_patch"] ** 2 * hidden * side * side * images
    return 3 * forward


def peak_of(args) -> tuple:
    """The device's dense BF16 peak (None where unknown) and its name."""
    name = torch.cuda.get_device_name(0)
    if args.peak_tflops:
        return args.peak_tflops * 1e12, name
    return next((peak for key, peak in PEAKS.items() if key in name), None), name


def run_torch_cuda(record: dict, args) -> dict:
    """The PyTorch bf16 loop on the GPU: steps per second, per-step losses, and the phases' shares."""
    import bench_gpu  # noqa: E402  (its F.scaled_dot_product_attention in the reference's place)

    batch = train_ref.load_batch(record["batch_json"])
    config = batch.optimizer
    model = train_ref.TrainModel(batch.checkpoint, torch.float32)
    masters, _ = ref.read_safetensors(str(batch.checkpoint) + ".optimizer")
    with torch.no_grad():
        for name, p in model.parameters.items():
            p.copy_(torch.from_numpy(masters[f"value.{name}"].copy()).reshape(p.shape))
    for tower in model.towers.values():
        tower.cuda()
    for p in (model.logit_scale, model.logit_bias):
        p.data = p.data.cuda()
    parameters = model.parameters
    prepared = [(kind, data.cuda()) for kind, data in model.prepare(batch.items)]
    decayed = [p for name, p in parameters.items() if train_ref.decays(name, p)]
    others = [p for name, p in parameters.items() if not train_ref.decays(name, p)]
    groups = [{"params": decayed, "weight_decay": config.weight_decay}, {"params": others, "weight_decay": 0.0}]
    options = {"lr": config.learning_rate, "betas": (config.beta1, config.beta2), "eps": config.epsilon}
    try:
        optimizer = torch.optim.AdamW(groups, fused=True, **options)
    except (TypeError, RuntimeError):
        optimizer = torch.optim.AdamW(groups, **options)
    history, phases = [], [0.0, 0.0, 0.0]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def step(number: int, timed: bool) -> None:
        optimizer.zero_grad(set_to_none=False)
        events[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, contrastive, lm = losses(model, prepared, batch.relations, batch.lm_weight, False)
        events[1].record()
        loss.backward()
        events[2].record()
        if config.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(list(parameters.values()), config.clip_norm)
        for group in optimizer.param_groups:
            group["lr"] = train_ref.learning_rate(config, number)
        optimizer.step()
        events[3].record()
        history.append((loss.item(), contrastive.item(), lm.item()))  # the step's loss, as the engine answers it
        if timed:
            for i in range(3):
                phases[i] += events[i].elapsed_time(events[i + 1])

    with bench_gpu.reference_attention(True):
        for number in range(1, args.warmup + 1):
            step(number, False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for number in range(args.warmup + 1, args.warmup + args.steps + 1):
            step(number, True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    rate = args.steps / seconds
    total = sum(phases) or 1.0
    return {"steps_per_second": rate, "items_per_second": rate * len(batch.items),
            "tokens_per_second": rate * record["tokens_per_step"], "history": history,
            "phases": {"forward": phases[0] / total, "backward": phases[1] / total, "optimizer": phases[2] / total}}


def main_cuda(args, exe: Path, workdir: Path) -> int:
    """The base configuration on the VRAM trainer beside PyTorch bf16 on the GPU: the table."""
    available = torch.cuda.is_available()
    if not available:
        print("--device cuda: this PyTorch sees no CUDA device; the engine runs alone")
    record, note = run_engine(exe, workdir, BASE, "text,image", args, BASE_IMAGE)
    name = (f"d{BASE['depth']} h{BASE['hidden']} c{BASE['context']} B{BASE['batch']} "
            f"images {BASE_IMAGE['image_size']}/{BASE_IMAGE['image_patch']}")
    if record is None:
        print(f"{name}: {note}")
        return 1
    theirs = run_torch_cuda(record, args) if available and not args.no_torch else None
    peak, device = peak_of(args) if available else (args.peak_tflops and args.peak_tflops * 1e12, "unknown")
    flops = step_flops(record)
    lines = [f"# training on {device}: {name}, {args.warmup} warm-up + {args.steps} timed steps, "
             f"{flops / 1e12:.2f} TFLOP a step, peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s",
             f"{'':26s} {'steps/s':>8s} {'samples/s':>10s} {'TFLOP/s':>8s} {'MFU':>6s}  phases"]
    torch_phases = ", ".join(f"{k} {v:.1%}" for k, v in (theirs or {}).get("phases", {}).items())
    engine_phases = f"host {record['host_share']:.1%}, device {1 - record['host_share']:.1%}"
    for label, figures, shares in (("uform VRAM trainer", record, engine_phases),
                                   ("torch bf16 autocast+sdpa", theirs, torch_phases)):
        if not figures:
            lines.append(f"{label:26s} {'n/a':>8s}")
            continue
        achieved = flops * figures["steps_per_second"]
        mfu = f"{achieved / peak:6.1%}" if peak else f"{'n/a':>6s}"
        lines.append(f"{label:26s} {figures['steps_per_second']:8.3f} {figures['items_per_second']:10.1f} "
                     f"{achieved / 1e12:8.1f} {mfu}  {shares}")
    if theirs:
        lines.append(f"uform / torch samples/s: {ratio(record['items_per_second'], theirs['items_per_second'])}")
        lines.append(f"first-step loss: uform {record['first_loss']:.6f}, torch {theirs['history'][0][0]:.6f}")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as file:
            file.write("\n".join(lines) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(common.REPOSITORY / "build"), help="the meson build folder")
    parser.add_argument("--bench-train", help="the bench_train executable (default: <build>/bench/bench_train)")
    parser.add_argument("--workdir", help="checkpoints and batches (default: <build>/bench-train)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps, for every engine")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--text-bytes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--towers", choices=("text", "text,image", "both"), default="both")
    parser.add_argument("--large", action="store_true", help="also depth 4, hidden 256, 64 items")
    parser.add_argument("--torch-per-item", action="store_true",
                        help="time the reference's own loop over texts, one forward per text")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu (the RAM trainer), or cuda or cuda:N (the VRAM trainer)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense BF16 peak, where it is not an H100/H200")
    parser.add_argument("--out", help="--device cuda: append the table to this file")
    args = parser.parse_args(argv)
    build = Path(args.build)
    exe = Path(args.bench_train or build / "bench" / "bench_train")
    workdir = Path(args.workdir or build / "bench-train")
    if not exe.exists():
        print(f"{exe} is not built: nothing to run")
        return 0
    if args.device != "cpu":
        return main_cuda(args, exe, workdir)
    sizes = [SMALL] + ([LARGE] if args.large else [])
    towers = ["text", "text,image"] if args.towers == "both" else [args.towers]
    print(f"{args.threads} threads, {args.warmup} warm-up + {args.steps} timed steps, texts of {args.text_bytes} "
          f"printable bytes, images {IMAGE['image_size']} px patch {IMAGE['image_patch']}; PyTorch {torch.__version__} "
          f"float32 on {common.torch_blas()} ({'the reference per text' if args.torch_per_item else 'texts batched'})")
    rows = []
    checked = False
    for size in sizes:
        for tower_set in towers:
            name = f"d{size['depth']} h{size['hidden']} c{size['context']} B{size['batch']} {tower_set}"
            record, note = run_engine(exe, workdir, size, tower_set, args)
            if record is None:
                print(f"{name}: {note}")
                continue
            print(f"{name}: {record['command']}")
            theirs = None
            if not args.no_torch:
                theirs = run_torch(record, args, check=not checked)
                if theirs["check"] is not None:
                    checked = True
                    print(f"{name}: batched texts vs the reference's per-text loss at the initial weights: "
                          f"{theirs['check']:+.2e}")
            rows.append((name, record, theirs))

    print(f"\n{'size':34s} {'engine steps/s':>14s} {'items/s':>9s} {'tokens/s':>9s} | {'torch steps/s':>13s} "
          f"{'items/s':>9s} {'tokens/s':>9s} | {'engine/torch':>12s}")
    for name, mine, theirs in rows:
        t = theirs or {}
        torch_figures = (f"{t['steps_per_second']:13.3f} {t['items_per_second']:9.1f} {t['tokens_per_second']:9.0f}"
                         if theirs else f"{'n/a':>13s} {'':9s} {'':9s}")
        print(f"{name:34s} {mine['steps_per_second']:14.3f} {mine['items_per_second']:9.1f} "
              f"{mine['tokens_per_second']:9.0f} | {torch_figures} | "
              f"{ratio(mine['steps_per_second'], t.get('steps_per_second')):>12s}")
    print(f"\n{'size':34s} {'loss at step':>12s} {'engine':>10s} {'torch':>10s} {'difference':>11s} {'relative':>9s}")
    for name, mine, theirs in rows:
        last = mine["last_step"]
        for label, step, value in (("1", 1, mine["first_loss"]), (str(last), last, mine["last_loss"])):
            if theirs:
                other = theirs["history"][step - 1][0]
                difference = value - other
                print(f"{name:34s} {label:>12s} {value:10.6f} {other:10.6f} {difference:+11.2e} "
                      f"{abs(difference) / max(abs(other), 1e-30):9.1e}")
            else:
                print(f"{name:34s} {label:>12s} {value:10.6f} {'n/a':>10s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
