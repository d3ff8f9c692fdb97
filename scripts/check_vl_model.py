"""Check the Qwen3-VL-8B dummy model directory on CPU with transformers and vLLM, offline.

Run it with a Python that has vLLM 0.24 installed (it pulls in torch and transformers 5), e.g.

    /tmp/vllmcpu/bin/python scripts/check_vl_model.py [MODEL_DIR] [--skip-vllm]

No GPU and no network: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are set before anything is imported,
and vLLM gets its CpuPlatform when it detects none (as scripts/vllm_flags.py does). Checks:

1. transformers ``AutoConfig`` reads a ``Qwen3VLConfig`` with the Qwen3-VL-8B sizes;
2. ``AutoTokenizer`` has the vision tokens at their ids; ``AutoProcessor`` is a
   ``Qwen3VLProcessor`` whose chat template renders ``<|vision_start|><|image_pad|><|vision_end|>``
   per image, and whose output for real Pillow images has as many ``<|image_pad|>`` tokens as
   Qwen's resize rule (computed here independently) gives patches / merge_size^2;
3. vLLM: ``EngineArgs(load_format="dummy", limit_mm_per_prompt={"image": 4})`` resolves the
   architecture and the model's max_model_len; its multimodal processor
   (``MULTIMODAL_REGISTRY.create_processor``) counts the same tokens per image; the renderer
   ``vllm serve`` uses for /v1/chat/completions (``renderer_from_config(...).render_chat``) turns
   an OpenAI-style message with base64 PNG/JPEG data URLs into a prompt with those placeholders.

Each check prints one line (``ok`` or ``FAIL``) with its numbers; exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import base64
import io
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# vLLM logs to stdout by default; keep stdout for this script's report. Must precede `import vllm`.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "models" / "qwen3-vl-8b-dummy"
WORKLOAD = ROOT / "conf" / "workload" / "image_heavy.yaml"

IMAGE_PAD = "<|image_pad|>"
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TOKEN_IDS = {
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
}
EXPECTED_TEXT = {
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
}
EXPECTED_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "out_hidden_size": 4096,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}

failures: list[str] = []


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(name: str, ok: bool, detail: str) -> None:
    _out(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def run(name: str, fn: Callable[[], None]) -> None:
    """Run one group of checks; an exception is a failed check, not the end of the script."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as exc:  # report and go on with the next group
        check(name, False, f"raised {type(exc).__name__}: {exc}")
    _out(f"     ({name}: {time.perf_counter() - t0:.1f} s)")


# --- Qwen's resize rule, written out here so the processors are checked against an independent
# computation (transformers' qwen2_vl image processing ``smart_resize``, used by Qwen3-VL).


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int):
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def expected_tokens(width: int, height: int, pre: dict[str, Any]) -> int:
    patch, merge = int(pre["patch_size"]), int(pre["merge_size"])
    h, w = smart_resize(
        height,
        width,
        patch * merge,
        int(pre["size"]["shortest_edge"]),
        int(pre["size"]["longest_edge"]),
    )
    return (h // patch) * (w // patch) // (merge * merge)


def tuner_estimate(width: int, height: int) -> int:
    """tuner.workload.images.image_tokens (28-pixel cells, Qwen2-VL style), for comparison."""
    return math.ceil(width / 28) * math.ceil(height / 28)


def make_image(width: int, height: int, seed: int):
    """A noisy colour gradient, as tuner.workload.images.make_image draws (numpy + Pillow)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    base = rng.uniform(0, 255, size=3).astype(np.float32)
    noise = rng.normal(0.0, 24.0, size=(height, width, 3)).astype(np.float32)
    arr = np.clip(base + 120 * x - 90 * y + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


def data_url(img: Any, fmt: str) -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt.upper())
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("model_dir", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--skip-vllm", action="store_true", help="only the transformers checks")
    args = ap.parse_args()
    model_dir = str(Path(args.model_dir).resolve())

    import json

    import yaml

    pre = json.loads((Path(model_dir) / "preprocessor_config.json").read_text(encoding="utf-8"))
    workload = yaml.safe_load(WORKLOAD.read_text(encoding="utf-8"))
    sizes = [(int(w), int(h)) for w, h in workload["images"]["sizes"]]
    _out(f"model dir {model_dir}; image sizes from {WORKLOAD.relative_to(ROOT)}: {sizes}")
    expected = {s: expected_tokens(s[0], s[1], pre) for s in sizes}
    _out(
        "expected image tokens (smart_resize, factor 32): "
        + ", ".join(f"{w}x{h} -> {n}" for (w, h), n in expected.items())
        + "; tuner's 28-px estimate: "
        + ", ".join(f"{w}x{h} -> {tuner_estimate(w, h)}" for w, h in sizes)
    )
    two = [sizes[1], sizes[-1]]  # 1024x768 and 1280x720 in image_heavy
    two_expected = sum(expected[s] for s in two)

    def hf_config() -> None:
        import transformers
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model_dir)
        _out(f"     transformers {transformers.__version__}")
        check("AutoConfig class", type(cfg).__name__ == "Qwen3VLConfig", type(cfg).__name__)
        text = {k: getattr(cfg.text_config, k) for k in EXPECTED_TEXT}
        check("text_config sizes", text == EXPECTED_TEXT, str(text))
        vis = {k: getattr(cfg.vision_config, k) for k in EXPECTED_VISION}
        vis["deepstack_visual_indexes"] = list(vis["deepstack_visual_indexes"])
        check("vision_config sizes", vis == EXPECTED_VISION, str(vis))
        rope = dict(cfg.text_config.rope_parameters or {})
        check(
            "mrope",
            rope.get("mrope_section") == [24, 20, 20] and rope.get("rope_theta") == 5000000,
            str(rope),
        )
        ids = (
            cfg.image_token_id,
            cfg.video_token_id,
            cfg.vision_start_token_id,
            cfg.vision_end_token_id,
        )
        check("config token ids", ids == (151655, 151656, 151652, 151653), str(ids))
        check(
            "dtype / tied embeddings",
            str(cfg.text_config.dtype) == "torch.bfloat16" and cfg.tie_word_embeddings is False,
            f"text dtype {cfg.text_config.dtype}, tie_word_embeddings {cfg.tie_word_embeddings}",
        )

    def hf_params() -> None:
        import torch
        from transformers import AutoConfig, Qwen3VLForConditionalGeneration

        cfg = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):  # shapes only, no memory
            model = Qwen3VLForConditionalGeneration(cfg)
        total = sum(p.numel() for p in model.parameters())
        vision = sum(p.numel() for p in model.model.visual.parameters())
        check(
            "parameter count (meta device)",
            vision == 576_388_336 and total == 8_767_123_696,
            f"total {total:,}, vision tower {vision:,}, text {total - vision:,}",
        )

    def hf_processor() -> None:
        from transformers import AutoProcessor, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        got = {t: tok.convert_tokens_to_ids(t) for t in TOKEN_IDS}
        check("tokenizer ids", got == TOKEN_IDS, str(got))
        enc = tok(PLACEHOLDER, add_special_tokens=False)["input_ids"]
        check("placeholder encodes as 3 ids", enc == [151652, 151655, 151653], str(enc))
        proc = AutoProcessor.from_pretrained(model_dir)
        names = (
            type(proc).__name__,
            type(proc.image_processor).__name__,
            type(proc.video_processor).__name__,
        )
        check("AutoProcessor classes", names[0] == "Qwen3VLProcessor", str(names))
        ip = proc.image_processor
        check(
            "image processor settings",
            (ip.patch_size, ip.merge_size, ip.temporal_patch_size) == (16, 2, 2)
            and (ip.size.shortest_edge, ip.size.longest_edge) == (65536, 16777216)
            and list(ip.image_mean) == [0.5] * 3
            and list(ip.image_std) == [0.5] * 3,
            f"patch {ip.patch_size}, merge {ip.merge_size}, temporal {ip.temporal_patch_size}, "
            f"size {ip.size.shortest_edge}..{ip.size.longest_edge} px, "
            f"mean {list(ip.image_mean)}, std {list(ip.image_std)}",
        )
        check(
            "processor and tokenizer share the chat template",
            proc.chat_template == tok.chat_template,
            f"{len(proc.chat_template or '')} characters",
        )
        images = [make_image(w, h, seed=i) for i, (w, h) in enumerate(two)]
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image"},
                    {"type": "image"},
                    {"type": "text", "text": "Compare the two pictures."},
                ],
            }
        ]
        text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        check(
            "apply_chat_template",
            text.count(PLACEHOLDER) == 2 and text.endswith("<|im_start|>assistant\n"),
            repr(text),
        )
        out = proc(text=[text], images=images, return_tensors="pt")
        ids = out["input_ids"][0].tolist()
        grid = out["image_grid_thw"].tolist()
        from_grid = sum(t * h * w for t, h, w in grid) // 4
        n_pad = ids.count(151655)
        check(
            "processor image tokens",
            n_pad == from_grid == two_expected,
            f"{len(two)} images {two}: image_grid_thw {grid}, <|image_pad|> x {n_pad}, "
            f"patches/4 = {from_grid}, expected {two_expected}; prompt {len(ids)} tokens, "
            f"pixel_values {tuple(out['pixel_values'].shape)}",
        )

    def vllm_checks() -> None:
        import vllm
        from vllm import platforms

        detected = platforms.current_platform
        if detected.is_unspecified():
            from vllm.platforms.cpu import CpuPlatform

            platforms._current_platform = CpuPlatform()  # read back by platforms.__getattr__
        _out(f"     vLLM {vllm.__version__}, platform {type(platforms.current_platform).__name__}")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.processing import TimingContext
        from vllm.multimodal.processing.inputs import ProcessorInputs
        from vllm.renderers.params import ChatParams
        from vllm.renderers.registry import renderer_from_config

        engine_args = EngineArgs(
            model=model_dir, load_format="dummy", limit_mm_per_prompt={"image": 4}
        )
        mc = engine_args.create_model_config()
        layers = mc.hf_text_config.num_hidden_layers
        check(
            "vLLM ModelConfig",
            mc.architecture == "Qwen3VLForConditionalGeneration"
            and mc.is_multimodal_model
            and mc.max_model_len == 262144
            and str(mc.dtype) == "torch.bfloat16"
            and (layers, mc.get_total_num_kv_heads(), mc.get_head_size()) == (36, 8, 128),
            f"architecture {mc.architecture}, is_multimodal_model {mc.is_multimodal_model}, "
            f"max_model_len {mc.max_model_len}, dtype {mc.dtype}, layers {layers}, "
            f"kv heads {mc.get_total_num_kv_heads()}, head size {mc.get_head_size()}, "
            f"hidden {mc.get_hidden_size()}, vocab {mc.get_vocab_size()}, "
            f"uses_mrope {mc.uses_mrope}",
        )
        kv_per_token = 2 * layers * mc.get_total_num_kv_heads() * mc.get_head_size() * 2
        _out(f"     KV bytes per token (bf16, TP 1): {kv_per_token:,}")
        proc = MULTIMODAL_REGISTRY.create_processor(mc)
        info = proc.info
        ip = info.get_image_processor()
        per_size = {
            s: info.get_num_image_tokens(
                image_width=s[0], image_height=s[1], image_processor=ip, mm_kwargs={}
            )
            for s in sizes
        }
        check(
            "vLLM tokens per image",
            per_size == expected,
            f"{type(proc).__name__}: "
            + ", ".join(f"{w}x{h} -> {n}" for (w, h), n in per_size.items()),
        )
        max_items = info.get_mm_max_tokens_per_item(mc.max_model_len, {"image": 4})
        check(
            "vLLM max tokens per item",
            max_items["image"] == int(pre["size"]["longest_edge"]) // (32 * 32),
            f"{dict(max_items)} (image: longest_edge {pre['size']['longest_edge']} px / 32^2)",
        )
        prompt = (
            "<|im_start|>user\n" + PLACEHOLDER * 2 + "Compare.<|im_end|>\n<|im_start|>assistant\n"
        )
        images = [make_image(w, h, seed=i) for i, (w, h) in enumerate(two)]
        items = info.parse_mm_data({"image": images})
        out = proc.apply(ProcessorInputs(prompt, items), TimingContext(enabled=False))
        ids = out["prompt_token_ids"]
        ranges = [(p.offset, p.length) for p in out["mm_placeholders"]["image"]]
        check(
            "vLLM processor.apply",
            ids.count(151655) == two_expected
            and [n for _, n in ranges] == [expected[s] for s in two],
            f"<|image_pad|> x {ids.count(151655)} of {len(ids)} prompt tokens, "
            f"placeholders (offset, length) {ranges}",
        )

        vllm_config = engine_args.create_engine_config()
        renderer = renderer_from_config(vllm_config)
        fmts = ["png", "jpeg"]
        messages = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Compare the two pictures."}]
                + [
                    {"type": "image_url", "image_url": {"url": data_url(img, fmts[i])}}
                    for i, img in enumerate(images)
                ],
            }
        ]
        params = ChatParams(chat_template_kwargs={"add_generation_prompt": True})
        conversations, engine_inputs = renderer.render_chat([messages], params)
        ein = engine_inputs[0]
        ids = ein["prompt_token_ids"]
        ranges = [(p.offset, p.length) for p in ein["mm_placeholders"]["image"]]
        text = renderer.get_tokenizer().decode([i for i in ids if i != 151655])
        check(
            "vLLM render_chat (OpenAI messages, data URLs)",
            ids.count(151655) == two_expected
            and text.count("<|vision_start|><|vision_end|>") == 2
            and text.endswith("<|im_start|>assistant\n"),
            f"{type(renderer).__name__}; conversation {conversations[0]}; "
            f"{len(ids)} prompt tokens, <|image_pad|> x {ids.count(151655)}, "
            f"placeholders {ranges}; prompt without image pads {text!r}",
        )
        # What the GPU worker's profile run will feed the vision tower (informative: the memory
        # model does not include it). With the H200 defaults (8192 batched tokens, 1024 seqs).
        from vllm.multimodal.encoder_budget import MultiModalBudget

        gpu_like = EngineArgs(
            model=model_dir,
            load_format="dummy",
            limit_mm_per_prompt={"image": 4},
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
        ).create_engine_config()
        budget = MultiModalBudget(gpu_like, MULTIMODAL_REGISTRY)
        _out(
            "     profile-run encoder budget (mnbt 8192, max_num_seqs 1024): compute "
            f"{budget.encoder_compute_budget} tokens, cache {budget.encoder_cache_size} tokens, "
            f"max tokens per item {dict(budget.mm_max_toks_per_item)}, items per batch "
            f"{dict(budget.mm_max_items_per_batch)}, per prompt "
            f"{dict(budget.mm_max_items_per_prompt)}"
        )

    run("transformers config", hf_config)
    run("transformers parameters", hf_params)
    run("transformers tokenizer/processor", hf_processor)
    if not args.skip_vllm:
        run("vLLM", vllm_checks)
    _out(f"{'FAILED: ' + ', '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
