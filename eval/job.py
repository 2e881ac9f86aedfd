"""The "eval" job kind: the Benchmarks page queues an EvalRequest's JSON and a worker runs the
grid (run_grid, as `sketchwalk eval` does), reporting progress on the job and storing the rows in
eval_results, where the Benchmarks page reads them.

Every write goes through the job's context (worker/context.py) and names its claim; the rows and
the job's end are one transaction, so a worker that lost the job (recovered after a pause, re-run
by another) stores nothing. Only retrieval tasks and lm tasks over bundled sources are accepted
(no file paths: the request may come from a browser).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.errors import SketchWalkError
from sketchwalk.store.errors import JobLostError

log = logging.getLogger(__name__)

KIND = "eval"


@dataclass(frozen=True)
class EvalRequest:
    """One eval grid as a job asks for it (RunRequest's twin): the only shape of an eval job's
    JSON, checked on creation, each bad value refused in one line."""

    tasks: str = "retrieval:passkey"
    lengths: tuple[int, ...] = (1024,)
    depths: tuple[float, ...] = (0.25, 0.75)
    methods: tuple[str, ...] = ("sketchwalk", "streaming")
    densities: tuple[float, ...] = (0.1, 0.3)
    new_tokens: int = 8
    block_size: int = 64
    model: str | None = None  # None: the deployment's default (the worker resolves it)
    dtype: str | None = None  # None: the worker's SKETCHWALK_DTYPE

    def __post_init__(self) -> None:
        if not isinstance(self.tasks, str) or not self.tasks.strip():
            raise SketchWalkError("an eval job names its tasks, e.g. 'retrieval:passkey'")
        for name, kind in (("lengths", int), ("depths", float), ("densities", float)):
            if not self._numbers(getattr(self, name), kind):
                raise SketchWalkError(f"an eval job's {name} must be a list of numbers")
        if not all(isinstance(m, str) for m in self.methods) or not self.methods:
            raise SketchWalkError("an eval job's methods must be a list of method names")
        for name in ("new_tokens", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SketchWalkError(f"an eval job's {name} must be a positive integer")
        if self.model is not None and not isinstance(self.model, str):
            raise SketchWalkError("an eval job's model must be a name or a folder path")
        if self.dtype is not None and not isinstance(self.dtype, str):
            raise SketchWalkError("an eval job's dtype must be a name such as float32")

    @staticmethod
    def _numbers(values: Any, kind: type) -> bool:
        """A non-empty list of numbers (of positive integers when `kind` is int)."""
        number = (int, float) if kind is float else (int,)
        return bool(values) and all(
            isinstance(v, number) and not isinstance(v, bool) and (kind is float or v >= 1)
            for v in values
        )

    def to_dict(self) -> dict[str, Any]:
        """The job's JSON (and what `from_dict` reads back)."""
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        return {"kind": KIND, **fields}

    @classmethod
    def from_dict(cls, data: Any) -> EvalRequest:
        """A request from a job's JSON (queued by any version of the page, or by hand)."""
        if not isinstance(data, dict):
            raise SketchWalkError("the job's request is not a JSON object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("lengths", "depths", "methods", "densities"):
            if name in known:
                if not isinstance(known[name], list):
                    raise SketchWalkError(f"an eval job's {name} must be a list")
                known[name] = tuple(known[name])
        return cls(**known)

    def spec(self):
        """The grid spec and parsed tasks; bad knobs and file tasks fail before the model loads."""
        from sketchwalk.eval.grid import GridSpec, configs
        from sketchwalk.eval.items import parse_tasks

        tasks = parse_tasks(self.tasks, check_files=False)  # whether a path exists: not said
        if any(kind == "file" for kind, _ in tasks):
            raise SketchWalkError("an eval job cannot read files; use lm or retrieval tasks")
        spec = GridSpec(
            methods=self.methods,
            densities=tuple(float(d) for d in self.densities),
            new_tokens=self.new_tokens,
            base={"block_size": self.block_size},
        )
        configs(spec)
        return spec, tasks


SMALL_EVAL: dict[str, Any] = EvalRequest(
    lengths=(2048,), densities=(0.1, 0.2), block_size=SketchWalkConfig().block_size
).to_dict()
"""A first look that takes a few minutes on two CPU cores: pass-key retrieval at 2k tokens with
the default blocks, where both densities are reachable (at 1k tokens and blocks of 64 the forced
sink and window blocks alone kept ~0.33, so 0.1 and 0.3 ran alike; at 2k, blocks of 32 ran 0.1
at ~0.12, blocks of 16 at ~0.10)."""


def eval_request(**changes: Any) -> dict[str, Any]:
    """The small eval's request with some fields changed (model, lengths, ...): an eval job."""
    return EvalRequest.from_dict({**SMALL_EVAL, **changes}).to_dict()


def run(ctx: Any) -> str | None:
    """Run one claimed eval job (a JobContext) to the end; returns the eval id (None when it
    failed or was lost). JobInterrupted from a checkpoint passes through (the worker releases
    the job); JobLostError too (the worker logs it): a lost job stores nothing."""
    from sketchwalk.eval.grid import run_grid
    from sketchwalk.eval.items import build_items

    try:
        req = EvalRequest.from_dict(ctx.request)
        spec, tasks = req.spec()
        ctx.report(0.0, "loading the model")
        dtype = req.dtype or ctx.worker.settings.dtype
        lm = ctx.worker.models.get(req.model, dtype, ctx.worker.device)
        lengths = tuple(int(n) for n in req.lengths)
        items = build_items(
            lm.tokenizer, tasks, lengths, req.depths, 1, 0, 1, lm.max_context - spec.new_tokens
        )
        if not items:
            raise SketchWalkError("the eval's tasks produced no prompts")
        eval_id = str(uuid.uuid4())
        rows = run_grid(
            lm, items, spec, eval_id, lambda f, msg: ctx.progress(0.98 * f, f"eval: {msg}")
        )
        ctx.store.save_eval_results(rows, job=ctx.fence)  # the rows and the job's end, fenced
        return eval_id
    except JobLostError:
        raise
    except SketchWalkError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "eval failed"
    except Exception as exc:  # keep the worker alive; tell the user
        log.exception("eval job %s failed", ctx.job.id)
        message = f"the eval failed: {type(exc).__name__}: {exc}".splitlines()[0]
    ctx.fail(message[:500])
    return None
