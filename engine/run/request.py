"""`RunRequest`: what one run needs, checked once, the same way for the CLI, the app and workers.

One set of rules, so a request that passes one entry point passes every other. Checks that need only
the request (text, knobs, limits) run when it is built; checks that need the loaded model (token
count, context, layer indices) run in `check_model`, still before anything is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.errors import ConfigError, SketchWalkError

if TYPE_CHECKING:  # torch-heavy imports only where a run really happens
    from sketchwalk.engine.run.models import LoadedModel
    from sketchwalk.engine.run.runner import RunOptions

DTYPE_NAMES = ("float32", "bfloat16", "float16")


class RequestError(SketchWalkError):
    """A run request a user can fix (prompt, knobs, limits, device)."""


@dataclass(frozen=True)
class Limits:
    """What one deployment allows; None means no limit (the CLI on one's own machine)."""

    max_prompt_chars: int | None = None
    max_new_tokens: int | None = None
    max_prompt_tokens: int | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(settings.max_prompt_chars, settings.max_new_tokens, settings.max_prompt_tokens)


@dataclass(frozen=True)
class RunRequest:
    """One dense-vs-sparse run as asked for; invalid values raise RequestError on creation."""

    prompt: str
    config: SketchWalkConfig = field(default_factory=SketchWalkConfig)
    model: str | None = None
    dtype: str = "float32"
    max_new_tokens: int = 32
    time_only: bool = False
    """Skip the per-layer records: the run keeps its generations, metrics, density and timings
    (a clean pass included), but the explorer pages have nothing to draw for it."""
    clean_timing: bool | None = None
    """Also time one clean dense and one clean sparse pass (no recorder; engine/run/timing.py): the
    ratio a user would get in their own code, beside the recording overhead. None means on: on
    CPU the two clean passes add about a third to a recorded run (SmolLM2, 1.2k tokens, 16 new:
    25 s on 72 s), far from doubling it, so every run reports them unless asked not to. A
    time-only run always times them (that is what it is for)."""
    exact_max_tokens: int = 8192
    limits: Limits = field(default_factory=Limits, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Other keys of a queued request (say, who asked), kept verbatim in the run's request."""

    def __post_init__(self) -> None:
        check_prompt(self.prompt, self.limits.max_prompt_chars)
        if not isinstance(self.config, SketchWalkConfig):
            raise RequestError("a run request's config must be a SketchWalkConfig")
        if self.model is not None and (not isinstance(self.model, str) or "\x00" in self.model):
            raise RequestError("the model must be a name or a folder path")
        if self.dtype not in DTYPE_NAMES:
            raise RequestError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        n = _int("max new tokens", self.max_new_tokens)
        cap = self.limits.max_new_tokens
        if n < 0 or (cap is not None and n > cap):
            upper = f" and {cap}" if cap is not None else " or more"
            raise RequestError(f"max new tokens must be between 0{upper}, got {n}")
        if _int("exact max tokens", self.exact_max_tokens) < 0:
            raise RequestError(f"exact max tokens must be >= 0, got {self.exact_max_tokens}")
        if not isinstance(self.time_only, bool):
            raise RequestError(f"time only must be true or false, got {self.time_only!r}")
        if self.clean_timing is not None and not isinstance(self.clean_timing, bool):
            raise RequestError(f"clean timing must be true or false, got {self.clean_timing!r}")
        if self.time_only and self.clean_timing is False:
            raise RequestError("a time-only run always times a clean pass: clean timing stays on")
        if self.clean_timing is None:
            object.__setattr__(self, "clean_timing", True)

    @property
    def record(self) -> bool:
        """Whether the run keeps per-layer records (everything but a time-only run)."""
        return not self.time_only

    # ---- as a queued job's JSON ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The job request shape the store keeps (and `from_dict` reads back)."""
        return {
            **self.extra,
            "prompt": self.prompt,
            "model": self.model or None,
            "dtype": self.dtype,
            "method": self.config.method,
            "config": self.config.to_dict(),
            "max_new_tokens": int(self.max_new_tokens),
            "time_only": self.time_only,
            "clean_timing": self.clean_timing,
            "record": self.record,  # what workers before time_only read
            "exact_max_tokens": int(self.exact_max_tokens),
        }

    @classmethod
    def from_dict(cls, data: Any, limits: Limits | None = None, **defaults: Any) -> RunRequest:
        """A request from a job's JSON (written by any version of the app, or by hand)."""
        if not isinstance(data, dict):
            raise RequestError("the job's request is not a JSON object")
        config = data.get("config") or {}
        if not isinstance(config, dict):
            raise RequestError("the job's config is not a JSON object")
        try:
            cfg = SketchWalkConfig.from_dict(dict(config))
        except (ConfigError, TypeError) as exc:
            raise RequestError(str(exc).splitlines()[0] if str(exc) else "bad config") from None
        known = {"prompt", "model", "dtype", "method", "config", "max_new_tokens", "record"}
        known |= {"exact_max_tokens", "time_only", "clean_timing"}
        prompt = data.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError("the job has no prompt text")
        return cls(
            prompt=prompt,
            config=cfg,
            model=data.get("model") or None,
            dtype=data.get("dtype") or defaults.get("dtype", "float32"),
            max_new_tokens=data.get("max_new_tokens", 32),
            time_only=stored_time_only(data),
            clean_timing=data.get("clean_timing"),
            exact_max_tokens=data.get("exact_max_tokens", defaults.get("exact_max_tokens", 8192)),
            limits=limits or Limits(),
            extra={k: v for k, v in data.items() if k not in known},
        )

    # ---- once the model is loaded -------------------------------------------------------

    def run_options(self) -> RunOptions:
        from sketchwalk.engine.run.recorder import RecorderOptions
        from sketchwalk.engine.run.runner import RunOptions

        return RunOptions(
            max_new_tokens=int(self.max_new_tokens),
            record=self.record,
            clean_timing=bool(self.clean_timing),
            recorder=RecorderOptions(exact_max_tokens=int(self.exact_max_tokens)),
            max_prompt_tokens=self.limits.max_prompt_tokens,
        )

    def check_kernels(self, device: object) -> None:
        """The block size and dtype against the limits of the kernels `device` runs
        (kernels/backends.py): on CUDA the Triton kernels need power-of-two blocks >= 16."""
        from sketchwalk.kernels import limits_error

        why = limits_error(str(device), self.config.block_size, self.dtype)
        if why is not None:
            raise RequestError(why)

    def check_model(self, lm: LoadedModel) -> int:
        """Checks that need the model: kernel limits on its device, prompt length in tokens,
        context, layer indices. Returns the prompt's token count."""
        from sketchwalk.engine.run.runner import tokenize, validate_prompt

        self.check_kernels(lm.device)
        layers = int(getattr(lm.model.config, "num_hidden_layers", 0) or 0)
        beyond = [x for x in self.config.dense_layers if layers and x >= layers]
        if beyond:
            raise RequestError(
                f"dense layers {', '.join(map(str, beyond))} do not exist: {lm.model_id} has "
                f"{layers} layers (0 to {layers - 1})"
            )
        n_tokens = int(tokenize(lm, self.prompt).shape[1])
        validate_prompt(n_tokens, lm, self.config, self.run_options())
        return n_tokens


def stored_time_only(data: Any) -> Any:
    """The time-only flag of a stored or queued request of any version: `time_only`, or, in
    requests from before it, `"record": false`. Not checked here (RunRequest checks it)."""
    if not isinstance(data, dict):
        return False
    return data.get("time_only", not bool(data.get("record", True)))


def check_prompt(prompt: Any, max_chars: int | None = None) -> str:
    """The text rules every entry point shares; returns the prompt unchanged."""
    if not isinstance(prompt, str):
        raise RequestError("the prompt must be text")
    if not prompt.strip():
        raise RequestError("the prompt is empty")
    if "\x00" in prompt:
        raise RequestError("the prompt contains a NUL character (binary data?); remove it")
    if max_chars is not None and len(prompt) > max_chars:
        raise RequestError(f"the prompt has {len(prompt)} characters; the limit is {max_chars}")
    return prompt


def check_device(device: str, request: RunRequest | None = None) -> str:
    """`cpu`, `cuda`, `cuda:N`, `mps`...: refuse a name torch does not know, and (with the
    request) knobs the device's kernels cannot run, in one line, before any model loads."""
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise RequestError(
            f"unknown device {device!r}; use cpu, cuda or cuda:N (cuda needs a GPU)"
        ) from None
    if request is not None:
        request.check_kernels(device)
    return device


def _int(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{what} must be an integer, got {value!r}")
    return value
