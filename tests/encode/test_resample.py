#!/usr/bin/env python3
"""The image front end's reference geometries (src/media/image_preprocess.h, image_resample.h) against
Pillow and the preprocessors of the pretrained towers, through tests/encode/resample_driver.c:

- Hugging Face's CLIPImageProcessor (transformers 4.44.2; shortest_edge, center_crop, BICUBIC and
  BILINEAR): IMAGE_RESIZE_SHORT_SIDE with IMAGE_RESAMPLE_PILLOW_BICUBIC and _BILINEAR;
- torchvision's Resize(size, BICUBIC), CenterCrop(size), ToTensor, Normalize on a PIL image (UForm 3):
  IMAGE_RESIZE_SHORT_SIDE_ROUND_CROP with IMAGE_RESAMPLE_PILLOW_BICUBIC. torchvision itself where it
  imports; elsewhere restated from its source (0.15 to 0.29 alike): _compute_resized_output_size's
  int(size * long / short), PIL's resize, crop at int(round((h - size) / 2.0)), then ToTensor's
  float32 division by 255 and Normalize's sub_ and div_ in float32, through PyTorch;
- SiglipImageProcessor (a direct resize to size x size, BICUBIC, mean and std 0.5): IMAGE_RESIZE_SQUARE.

For each, at 224, 256 and 384, on generated images (noise, saturated edges, gradients; 1-pixel,
thin, odd, exact, growing and shrinking shapes, padded rows), JPEG and PNG photos generated here, and
the photos of skimage.data (astronaut, chelsea, coffee, rocket, ...): the engine's 8-bit crop equals
Pillow's resize and crop byte for byte, and the reference processor's 8-bit output; its floats equal
the reference's float32 arithmetic (the count of values off by one unit in the last place is reported,
none expected; more fails). The engine's own float bilinear path under each resize against a NumPy
float64 statement of its formula; refusals (a resize or resample out of range, no 8-bit crop for the
float path).

    test_resample.py --driver build/tests/resample_driver [--stride N]

With --stride N only every N-th image of the comparisons with the references runs (the sanitized and
POSIX-only builds, whose part is the driver's memory and calls rather than the numbers).

Skipped (77) where Pillow, NumPy or transformers does not import; the skimage photos need
python3-skimage. Under CI=true a missing dependency fails."""
import argparse
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import optional_import, run_under_python_with  # noqa: E402

RESIZE = {"short-side": 0, "short-side-round-crop": 1, "square": 2}
RESAMPLE = {"float-bilinear": 0, "pillow-bicubic": 1, "pillow-bilinear": 2}
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
NAME_BYTES = 24
BATCH_BYTES = 64 << 20  # of floats coming back, per run of the driver

# Shapes (height, width): one pixel, thin both ways, odd, exactly the size, one more and three more
# (which the two crops place differently), growing and shrinking, elongated.
SHAPES = [(1, 1), (1, 2), (2, 1), (3, 3), (1, 7), (7, 1), (2, 5), (5, 3), (13, 17), (31, 64), (64, 31),
          (100, 100), (223, 224), (224, 224), (224, 225), (224, 227), (227, 224), (224, 300), (300, 224),
          (256, 256), (255, 257), (257, 259), (383, 385), (384, 512), (480, 640), (640, 480), (333, 517),
          (517, 333), (1000, 750), (1023, 1025), (1536, 2048), (1, 257), (300, 1), (3, 400), (700, 2),
          (1500, 11)]


class Checker:
    def __init__(self):
        self.checks = 0
        self.failures = 0

    def check(self, ok, what):
        self.checks += 1
        if not ok:
            self.failures += 1
            if self.failures <= 40:
                print(f"FAIL: {what}", flush=True)
        return ok


class Case:
    """One image through one geometry; `reference` names the preprocessor it stands for."""

    def __init__(self, name, rgb, reference, size, patch, resize, resample, mean, std, padding=0):
        self.name, self.rgb, self.reference = name, rgb, reference
        self.size, self.patch, self.resize, self.resample = size, patch, resize, resample
        self.mean, self.std, self.padding = mean, std, padding

    def __str__(self):
        height, width = self.rgb.shape[:2]
        return f"{self.reference} {self.resample} {self.size}: {self.name} {height}x{width}"


# ---- Images ------------------------------------------------------------------------------------------

def synthetic(np, height, width, seed):
    """Noise, saturated edges and a gradient, by seed: what rounds, overshoots and clips."""
    rng = np.random.default_rng(seed)
    kind = seed % 3
    if kind == 0:
        return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    y, x = np.mgrid[0:height, 0:width]
    if kind == 1:
        board = ((y // 3 + x // 5) % 2) * 255
        return np.stack([board, 255 - board, (x * 7) % 256], axis=-1).astype(np.uint8)
    smooth = 127 + 100 * np.sin(0.05 * x[..., None] * (np.arange(3) + 1) + 0.031 * y[..., None])
    return np.clip(smooth + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)


def generated_photos(np, Image):
    """Scenes encoded as JPEG and PNG by Pillow and decoded back: blocky chroma, ringing, flat areas."""
    import io
    photos = []
    for index, (height, width) in enumerate([(480, 640), (375, 500), (768, 512), (333, 1000)]):
        y, x = np.mgrid[0:height, 0:width]
        scene = np.stack([(x * 255) // width, (y * 255) // height, ((x // 40 + y // 40) % 2) * 200 + 30], -1)
        scene[(x - width // 3) ** 2 + (y - height // 2) ** 2 < (min(height, width) // 5) ** 2] = (250, 40, 20)
        scene = np.clip(scene + np.random.default_rng(index).normal(0, 6, scene.shape), 0, 255).astype(np.uint8)
        for fmt, options in (("JPEG", {"quality": 85}), ("PNG", {})):
            buffer = io.BytesIO()
            Image.fromarray(scene).save(buffer, fmt, **options)
            buffer.seek(0)
            photos.append((f"{fmt.lower()} photo {index}", np.asarray(Image.open(buffer).convert("RGB"))))
    return photos


def skimage_photos(data):
    names = ["astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina"]
    return [(f"skimage {name}", getattr(data, name)()) for name in names]


# ---- References --------------------------------------------------------------------------------------

def short_side(height, width, size):
    """(height, width) after transformers' get_resize_output_image_size(default_to_square=False) and
    torchvision's _compute_resized_output_size, which agree: int(size * long / short) in floats."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def pillow_crop(np, Image, case):
    """Pillow's resize and crop, as each reference places them."""
    height, width = case.rgb.shape[:2]
    size = case.size
    out_height, out_width = (size, size) if case.resize == "square" else short_side(height, width, size)
    resized = Image.fromarray(case.rgb).resize((out_width, out_height), pillow_filter(Image, case.resample))
    if case.resize == "short-side":  # transformers' center_crop: (orig - crop) // 2
        top, left = (out_height - size) // 2, (out_width - size) // 2
    elif case.resize == "short-side-round-crop":  # torchvision's center_crop
        top, left = int(round((out_height - size) / 2.0)), int(round((out_width - size) / 2.0))
    else:
        top, left = 0, 0
    return np.asarray(resized.crop((left, top, left + size, top + size)))


def pillow_filter(Image, resample):
    return {"pillow-bicubic": Image.BICUBIC, "pillow-bilinear": Image.BILINEAR}[resample]


class References:
    def __init__(self, np, Image, transformers, torch, torchvision):
        self.np, self.Image, self.transformers, self.torch, self.torchvision = (
            np, Image, transformers, torch, torchvision)

    def hugging_face(self, case):
        """CLIPImageProcessor or SiglipImageProcessor: the 8-bit output (no rescale, no normalize,
        channels last) and the float one [3, size, size]. input_data_format is given: on an image 1 or 3
        pixels tall, the processors would otherwise take the rows for channels."""
        size, resample = case.size, pillow_filter(self.Image, case.resample)
        if case.reference == "hf-clip":
            processor = self.transformers.CLIPImageProcessor(
                size={"shortest_edge": size}, crop_size={"height": size, "width": size}, resample=resample,
                image_mean=list(case.mean), image_std=list(case.std))
        else:
            processor = self.transformers.SiglipImageProcessor(
                size={"height": size, "width": size}, resample=resample, image_mean=list(case.mean),
                image_std=list(case.std))
        common = {"return_tensors": "np", "input_data_format": "channels_last"}
        pixels = processor(images=case.rgb, do_rescale=False, do_normalize=False, data_format="channels_last",
                           **common)["pixel_values"][0]
        values = processor(images=case.rgb, **common)["pixel_values"][0]
        return pixels, values

    def torchvision_path(self, case):
        """Resize(size, BICUBIC) and CenterCrop(size) on a PIL image, then ToTensor and Normalize."""
        np, torch = self.np, self.torch
        if self.torchvision:
            transforms = self.torchvision.transforms
            image = transforms.CenterCrop(case.size)(transforms.Resize(
                case.size, interpolation=transforms.InterpolationMode.BICUBIC)(self.Image.fromarray(case.rgb)))
            pixels = np.asarray(image)
            values = transforms.Normalize(case.mean, case.std)(transforms.ToTensor()(image)).numpy()
            return pixels, values
        pixels = pillow_crop(np, self.Image, case)
        if torch is None:
            x = pixels.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
            mean, std = (np.array(v, dtype=np.float32)[:, None, None] for v in (case.mean, case.std))
            return pixels, (x - mean) / std
        x = torch.from_numpy(np.array(pixels, copy=True)).permute(2, 0, 1).contiguous().to(torch.float32).div(255)
        mean = torch.as_tensor(case.mean, dtype=torch.float32)[:, None, None]
        std = torch.as_tensor(case.std, dtype=torch.float32)[:, None, None]
        return pixels, x.sub_(mean).div_(std).numpy()

    def expected(self, case):
        if case.reference == "torchvision":
            return self.torchvision_path(case)
        return self.hugging_face(case)


def float_bilinear(np, case):
    """The engine's float path as image_preprocess.h states it, in float64: [3, size, size]."""
    height, width = case.rgb.shape[:2]
    size = case.size
    out_height, out_width = (size, size) if case.resize == "square" else (
        (size, width * size // height) if height < width else (height * size // width, size) if width < height
        else (size, size))

    def start(excess):
        half = excess // 2
        return half + 1 if case.resize == "short-side-round-crop" and excess % 2 and half % 2 else half

    def axis(n_in, n_out, offset):
        scale = n_in / n_out
        support = max(scale, 1.0)
        matrix = np.zeros((size, n_in))
        for o in range(size):
            center = scale * (offset + o + 0.5)
            first, last = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
            j = np.arange(first, last)
            weights = np.maximum(0.0, 1.0 - np.abs(j + 0.5 - center) / support)
            matrix[o, first:last] = weights / weights.sum()
        return matrix

    rows = axis(height, out_height, start(out_height - size))
    columns = axis(width, out_width, start(out_width - size))
    samples = np.einsum("oy,yxc,px->cop", rows, case.rgb.astype(np.float64), columns)
    mean, std = (np.array(v)[:, None, None] for v in (case.mean, case.std))
    return (samples / 255.0 - mean) / std


# ---- The driver --------------------------------------------------------------------------------------

def pack(np, case, resize=None, resample=None):
    height, width = case.rgb.shape[:2]
    rows = case.rgb.reshape(height, width * 3)
    if case.padding:
        rows = np.concatenate([rows, np.full((height, case.padding), 0xA5, np.uint8)], axis=1)
    header = struct.pack("=8I6f", height, width, case.padding, case.size, case.patch,
                         RESIZE[case.resize] if resize is None else resize,
                         RESAMPLE[case.resample] if resample is None else resample, 0, *case.mean, *case.std)
    return header + rows.tobytes()


def run_driver(np, driver, cases, overrides=None):
    """[(crop status, crop or None, preprocess status, values [3, size, size] or None)] per case."""
    overrides = overrides or [{} for _ in cases]
    payload = b"".join(pack(np, case, **override) for case, override in zip(cases, overrides))
    done = subprocess.run([driver], input=payload, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"FAIL: {driver} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    out, at, results = done.stdout, 0, []
    for case in cases:
        statuses = []
        for _ in range(2):
            statuses.append(out[at:at + NAME_BYTES].rstrip(b"\0").decode())
            at += NAME_BYTES
        size, patch = case.size, case.patch
        crop = values = None
        if statuses[0] == "ok":
            crop = np.frombuffer(out, np.uint8, size * size * 3, at).reshape(size, size, 3)
            at += size * size * 3
        if statuses[1] == "ok":
            side = size // patch
            rows = np.frombuffer(out, np.float32, size * size * 3, at)
            at += size * size * 3 * 4
            values = rows.reshape(side, side, 3, patch, patch).transpose(2, 0, 3, 1, 4).reshape(3, size, size)
        results.append((statuses[0], crop, statuses[1], values))
    if at != len(out):
        raise SystemExit(f"FAIL: {driver} wrote {len(out)} bytes, {at} expected")
    return results


def batches(cases):
    batch, floats = [], 0
    for case in cases:
        batch.append(case)
        floats += case.size * case.size * 12
        if floats > BATCH_BYTES:
            yield batch
            batch, floats = [], 0
    if batch:
        yield batch


# ---- Comparisons -------------------------------------------------------------------------------------

def ulps(np, got, expected):
    """The distance in units in the last place between two float32 arrays (same signs here)."""
    a = got.astype(np.float32).view(np.int32).astype(np.int64)
    b = expected.astype(np.float32).view(np.int32).astype(np.int64)
    return np.abs(a - b)


def compare_references(np, Image, references, driver, cases, checker):
    tally = {}
    for batch in batches(cases):
        for case, (crop_status, crop, status, values) in zip(batch, run_driver(np, driver, batch)):
            key = (case.reference, case.resample, case.size)
            counts = tally.setdefault(key, [0, 0, 0])
            counts[0] += 1
            if not checker.check(crop_status == "ok" and status == "ok",
                                 f"{case}: statuses {crop_status}, {status}"):
                continue
            pillow = pillow_crop(np, Image, case)
            pixels, expected = references.expected(case)
            if not checker.check(np.array_equal(crop, pillow),
                                 f"{case}: {int((crop != pillow).sum())} of {crop.size} bytes differ from "
                                 f"Pillow's resize and crop (max {int(np.abs(crop.astype(int) - pillow).max())})"):
                continue
            checker.check(np.array_equal(crop, pixels),
                          f"{case}: {int((crop != pixels).sum())} bytes differ from the reference processor's")
            distance = ulps(np, values, expected)
            counts[1] += int((distance != 0).sum())
            counts[2] += values.size
            checker.check(distance.max() <= 1, f"{case}: floats {int(distance.max())} ulps from the reference's "
                          f"(max abs {float(np.abs(values - expected).max()):.3g})")
    for (reference, resample, size), (count, off, total) in sorted(tally.items()):
        print(f"  {reference:11} {resample:15} {size}: {count:3} images, pixels compared byte for byte; "
              f"{off} of {total} floats one ulp off", flush=True)


def compare_float_path(np, driver, cases, checker):
    worst = 0.0
    for batch in batches(cases):
        for case, (crop_status, _, status, values) in zip(batch, run_driver(np, driver, batch)):
            checker.check(crop_status == "unsupported", f"{case}: the float path's crop answers {crop_status}")
            if not checker.check(status == "ok", f"{case}: {status}"):
                continue
            error = float(np.abs(values - float_bilinear(np, case)).max())
            worst = max(worst, error)
            checker.check(error < 5e-4, f"{case}: the float path is {error:.3g} from its formula")
    print(f"  float path: {len(cases)} images under the three resizes, within {worst:.2g} of its formula "
          "in float64", flush=True)


def compare_refusals(np, driver, checker):
    rgb = synthetic(np, 20, 30, 4)
    case = Case("refusal", rgb, "none", 32, 16, "short-side", "pillow-bicubic", HALF, HALF)
    overrides = [{"resize": 3}, {"resample": 3}, {"resize": 0xFFFFFFFF}]
    for override, (crop_status, _, status, _) in zip(overrides, run_driver(np, driver, [case] * 3, overrides)):
        checker.check(crop_status == status == "invalid_argument",
                      f"{override}: answers {crop_status}, {status}, not invalid_argument")
    print("  refusals: a resize or resample out of range", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--stride", type=int, default=1)
    arguments = parser.parse_args()
    run_under_python_with(["PIL", "numpy", "transformers"])
    import numpy as np
    import PIL
    import transformers
    from PIL import Image
    torch = optional_import("torch", "torchvision's float arithmetic through PyTorch (NumPy's float32 instead)")
    data = optional_import("skimage.data", "the photos of skimage.data (generated JPEG and PNG photos only)")
    try:
        import torchvision
    except ImportError:
        torchvision = None
    print(f"Pillow {PIL.__version__}, transformers {transformers.__version__}, "
          f"torchvision {torchvision.__version__ if torchvision else 'restated from its source'}", flush=True)
    references = References(np, Image, transformers, torch, torchvision)
    photos = generated_photos(np, Image) + (skimage_photos(data) if data else [])

    cases = []
    settings = [("hf-clip", "short-side", "pillow-bicubic", CLIP_MEAN, CLIP_STD),
                ("hf-clip", "short-side", "pillow-bilinear", CLIP_MEAN, CLIP_STD),
                ("torchvision", "short-side-round-crop", "pillow-bicubic", CLIP_MEAN, CLIP_STD),
                ("hf-siglip", "square", "pillow-bicubic", HALF, HALF)]
    for reference, resize, resample, mean, std in settings:
        for size, patch in ((224, 14), (256, 16), (384, 32)):
            for index, (height, width) in enumerate(SHAPES):
                rgb = synthetic(np, height, width, index + size)
                cases.append(Case("generated", rgb, reference, size, patch, resize, resample, mean, std,
                                  padding=index % 3 * 5))
            for name, rgb in photos:
                cases.append(Case(name, rgb, reference, size, patch, resize, resample, mean, std))
    checker = Checker()
    compare_references(np, Image, references, arguments.driver, cases[::arguments.stride], checker)

    floats = []
    for resize in RESIZE:
        for index, (height, width) in enumerate([(1, 1), (3, 40), (40, 3), (60, 61), (61, 60), (65, 67),
                                                 (67, 65), (100, 70), (500, 375), (31, 32)]):
            floats.append(Case("generated", synthetic(np, height, width, index), "engine", 32, 16, resize,
                               "float-bilinear", CLIP_MEAN, CLIP_STD, padding=index % 2 * 3))
    compare_float_path(np, arguments.driver, floats, checker)
    compare_refusals(np, arguments.driver, checker)
    print(f"{checker.checks - checker.failures} of {checker.checks} checks pass", flush=True)
    sys.exit(1 if checker.failures else 0)


if __name__ == "__main__":
    main()
