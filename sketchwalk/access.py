"""What the web page lets its users do: which models it may load, and whether they may delete or
import runs.

On one's own machine (no settings file) everything is allowed, as before. A shared deployment
points SKETCHWALK_APP_CONFIG at a TOML file:

    [models]
    default = "SmolLM2 135M"                      # a name below
    [models.allowed]                               # name shown on the page = what is loaded
    "SmolLM2 135M" = "smollm2"
    "Qwen2.5 0.5B" = "Qwen/Qwen2.5-0.5B-Instruct"
    "tiny (local)" = "/models/tiny-llama"

    [rights]
    delete = false
    import = false

The page then offers the listed names only, so a browser can never make the server open an
arbitrary path; workers refuse jobs for any other model, whoever queued them.
SKETCHWALK_ALLOW_DELETE=0 / SKETCHWALK_ALLOW_IMPORT=0 switch those rights off without a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from sketchwalk.errors import SketchWalkError

ENV_FILE = "SKETCHWALK_APP_CONFIG"


class AccessError(SketchWalkError):
    """The settings file is unusable, or a request asks for something it does not allow."""


@dataclass(frozen=True)
class Access:
    """None for `models` means any model (single user); otherwise name -> model id or folder."""

    models: dict[str, str] | None = None
    default_model: str | None = None
    allow_delete: bool = True
    allow_import: bool = True
    source: str | None = field(default=None, compare=False)

    @property
    def restricted(self) -> bool:
        return self.models is not None

    def resolve(self, name: str | None) -> str | None:
        """The model a page choice stands for (None: the default model)."""
        if self.models is None:
            return (name or "").strip() or None
        chosen = name or self.default_model
        if chosen not in self.models:
            raise AccessError(f"model {chosen!r} is not one this deployment offers")
        return self.models[chosen]

    def job_model(self, model: object) -> str | None:
        """The model a queued job (of any kind) may load, whoever queued it.

        Unrestricted: the job's own (None: the engine's default). Restricted: a listed id, and
        a job naming none gets this deployment's default (listed by construction), never the
        engine's. Anything else is refused in a line that names nothing: not the model, not
        whether such a path or id exists (nothing is looked up before the check).
        """
        if model is not None and not isinstance(model, str):
            raise AccessError("a job's model must be a name or a folder path")
        if self.models is None:
            return (model or "").strip() or None
        if not model:
            return self.models[self.default_model or ""]
        if model not in set(self.models.values()):
            raise AccessError(
                f"the job's model is not on this deployment's list of models ({ENV_FILE}); "
                "ask its operator to add it"
            )
        return model

    def check_model(self, model: str | None) -> None:
        """Refuse a job whose model is not on the list (from whatever queued it)."""
        self.job_model(model)


def load(env: dict[str, str] | None = None) -> Access:
    """The policy of this process: the file named by SKETCHWALK_APP_CONFIG, then env switches."""
    env = dict(os.environ) if env is None else env
    path = env.get(ENV_FILE, "").strip()
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise AccessError(f"cannot read {ENV_FILE} file {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise AccessError(f"{ENV_FILE} file {path} is not valid TOML: {exc}") from None
    models, default = _models(data.get("models"), path)
    rights = data.get("rights") or {}
    if not isinstance(rights, dict):
        raise AccessError(f"[rights] in {path} must be a table")
    return Access(
        models=models,
        default_model=default,
        allow_delete=_flag(env, "SKETCHWALK_ALLOW_DELETE", rights.get("delete", True), path),
        allow_import=_flag(env, "SKETCHWALK_ALLOW_IMPORT", rights.get("import", True), path),
        source=path or None,
    )


def _models(section: Any, path: str) -> tuple[dict[str, str] | None, str | None]:
    if section is None:
        return None, None
    allowed = section.get("allowed") if isinstance(section, dict) else None
    if not isinstance(allowed, dict) or not allowed:
        raise AccessError(f"[models.allowed] in {path} must name at least one model")
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in allowed.items()):
        raise AccessError(f"[models.allowed] in {path} maps names to model ids or folders")
    default = section.get("default", next(iter(allowed)))
    if default not in allowed:
        raise AccessError(f"models.default {default!r} in {path} is not in [models.allowed]")
    return dict(allowed), default


def _flag(env: dict[str, str], name: str, default: Any, path: str) -> bool:
    raw = env.get(name)
    if raw is None or not raw.strip():
        if not isinstance(default, bool):
            raise AccessError(f"[rights] values in {path} must be true or false")
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")
