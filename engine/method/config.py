"""The knobs of one Sketch&Walk run: declared once, validated once.

Every field of `SketchWalkConfig` carries a `Knob` (help, group, range or choices). The command
line flags (`sketchwalk run`, `eval`) and the New run page's widgets are generated from these
declarations, so a new knob is one field here plus its test. Presets are plain data next to it.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from sketchwalk.engine.method import estimators, methods
from sketchwalk.engine.method.estimators import Estimator
from sketchwalk.errors import ConfigError

PHASES = ("prefill", "decode", "both")
BUDGETS = ("layer", "row")
LAYER_PROFILES = ("auto", "uniform")
POOLS = ("max", "mean")
SCORE_DTYPES = ("auto", "bfloat16", "float32")


@dataclass(frozen=True)
class Knob:
    """How a config field is shown and checked: what it means, where it sits, what it accepts.

    lo/hi bound numbers (lo_open: lo itself is refused); choices list the allowed strings
    (a callable returning them when the list lives elsewhere, e.g. the method registry).
    """

    help: str
    group: str = "advanced"  # "basic" knobs are shown up front, "advanced" ones folded
    label: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] | Any = ()
    power_of_two: bool = False
    flag: str = ""  # the CLI flag when it differs from the field name (--phase for phases)

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.choices()) if callable(self.choices) else tuple(self.choices)


def knob(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its Knob declaration in the metadata."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults need a factory")
    return field(default=default, metadata={"knob": Knob(help=help, **kw)})


def _method_names() -> tuple[str, ...]:
    return methods.names()


def _estimator_names() -> tuple[str, ...]:
    return estimators.names()


@dataclass(frozen=True)
class SketchWalkConfig:
    """One run's knobs. Defaults meet every quality target of docs/quality.md at the best
    whole-model speed measured with them; `preset("fidelity")` is closest to dense and
    `preset("paper")` gives the published configuration."""

    method: str = knob(
        "sketchwalk",
        "how blocks are scored (see docs/method.md)",
        group="basic",
        label="Method",
        choices=_method_names,
    )
    density: float = knob(
        0.2,
        "target density: kept causal block pairs / all causal pairs, sparse layers",
        group="basic",
        label="Target density",
        lo=0.0,
        hi=1.0,
        lo_open=True,
    )
    phases: str = knob(
        "both",
        "where attention is sparse",
        group="basic",
        label="Sparse in",
        choices=PHASES,
        flag="phase",
    )
    block_size: int = knob(
        16,
        "tokens per block (a power of two): smaller blocks keep what matters more exactly "
        "(GPL-3 6k, KL 0.020 at 16 against 0.031 at 32) but the block matrices grow as "
        "(T / block)^2 and the explorer draws at most 4096 blocks a layer, so take 32 beyond "
        "64k tokens (64 with the walk, which costs n^3, beyond ~16k)",
        label="Block size",
        lo=1,
        hi=4096,
        power_of_two=True,
    )
    query_block: int = knob(
        64,
        "query tokens that share one block list (a power of two; 0 or anything up to the "
        "block size = one block): keys stay in fine blocks while the kernel runs long query "
        "tiles; with the layer budget only",
        label="Query tile",
        lo=0,
        hi=1 << 16,
    )
    per_group: bool = knob(
        True,
        "select blocks per KV-head group (False: one selection per layer)",
        label="Per KV-head group",
    )
    pool: str = knob(
        "max",
        "how the block scores of what shares one list combine (an estimator's scored queries "
        "in a block, the blocks of a query tile, the heads of a group): 'max' ranks a block by "
        "the one that needs it most (it pays with 4 or more scored queries per block), 'mean' "
        "by their average mass (as good with 1 or 2)",
        label="Pooling",
        choices=POOLS,
    )
    budget: str = knob(
        "layer",
        "how the density budget is spread: 'layer' gives the non-forced budget to the "
        "highest scores anywhere in the layer (rows keep different counts); 'row' keeps the "
        "same rate in every row",
        label="Budget",
        choices=BUDGETS,
    )
    layer_profile: str = knob(
        "auto",
        "how the density is spread over the sparse layers: 'auto' follows the model's layer "
        "profile where one is calibrated (`sketchwalk calibrate`; shipped for SmolLM2-135M), "
        "the mean staying at the target; 'uniform' gives every sparse layer the target",
        label="Layer profile",
        choices=LAYER_PROFILES,
    )
    sink: float = knob(
        0.0,
        "sink: the first blocks covering this fraction of the context are always kept",
        label="Sink (fraction of context)",
        lo=0.0,
        hi=1.0,
    )
    sink_blocks: int = knob(
        1,
        "at least this many first blocks are always kept (a floor under sink)",
        label="Sink blocks (floor)",
        lo=0,
        hi=1 << 20,
    )
    window: float = knob(
        0.0,
        "local window: blocks covering this fraction of the context before each query "
        "block are always kept",
        label="Window (fraction of context)",
        lo=0.0,
        hi=1.0,
    )
    window_blocks: int = knob(
        1,
        "at least this many blocks before the diagonal block are always kept",
        label="Window blocks (floor)",
        lo=0,
        hi=1 << 20,
    )
    dense_tail_blocks: int = knob(
        0,
        "the last query blocks of a prefill that stay dense",
        label="Dense tail blocks",
        lo=0,
        hi=1 << 20,
    )
    dense_layers: tuple[int, ...] = knob(
        (0, 1),
        "layer ids that always run dense (comma-separated; '' for none)",
        label="Dense layers",
    )
    sketch_dim: int = knob(
        128, "kept coordinates r of the Hadamard sketch", label="Sketch dim r", lo=1, hi=1 << 16
    )
    estimator: str = knob(
        "sampled",
        "block estimate: 'mean' scores block-mean queries against block-mean keys (the "
        "paper); 'query' scores every sketched query against each key block's mean and "
        "variance, then averages per query block; 'sampled' scores query_samples queries per "
        "block against every sketched key in prefill (the query estimate in decode)",
        label="Estimator",
        choices=_estimator_names,
    )
    sampled_depth: float = knob(
        0.7,
        "the first fraction of the model's layers estimate with the sampled estimator "
        "(query_samples queries per block) whatever `estimator` says: block means cost least "
        "but fail in a small model's early layers (SmolLM2: layers 3-10, attention output error "
        "up to 7x the sampled estimator's), so a cheap selection can keep single queries there",
        label="Sampled estimator up to depth",
        lo=0.0,
        hi=1.0,
    )
    query_samples: int = knob(
        8,
        "token-level estimators: evenly spaced queries scored per block (0 = every query); "
        "8 of 16 against 4: Apache-2.0 KL 0.042 against 0.053 for ~1.6 s more of a 7k prefill",
        label="Estimator queries per block",
        lo=0,
        hi=1 << 16,
    )
    score_rank: int = knob(
        0,
        "the sampled estimator's scores in a prefill in this many coordinates, fitted per layer "
        "and KV head to its queries and keys (the closest rank-r approximation of their inner "
        "products; 0 or the sketch's width: the sketched product itself): at 24 of 64 the "
        "estimator's product costs 3/8, for GPL-3 KL 0.032 against 0.030 with 32-token blocks "
        "but 0.020 against 0.017 with 16, and Apache-2.0 0.063 against 0.053 at rank 32",
        label="Estimator score rank",
        lo=0,
        hi=1 << 16,
    )
    score_dtype: str = knob(
        "auto",
        "the sampled estimator's score product in a prefill and in decode's re-selections: "
        "'float32' is the exact reference "
        "and, on a CPU, one fused C call with the softmax; 'bfloat16' (the softmax and the "
        "masses stay float32) the same fused call on AMX tiles where the CPU has them (a "
        "layer's selection 1.3x faster than in float32 at 7376 tokens, the same KL on four "
        "texts: docs/speed.md), else "
        "a oneDNN product with the softmax apart (slower than the float32 call); 'auto' takes "
        "bfloat16 on CUDA and on CPUs with AMX, float32 on other CPUs with the C kernels, else "
        "bfloat16 where oneDNN has it natively",
        label="Estimator score dtype",
        choices=SCORE_DTYPES,
    )
    tau: float = knob(
        1.0,
        "temperature of the block softmax",
        label="Temperature τ",
        lo=0.0,
        hi=1e6,
        lo_open=True,
    )
    beta: float = knob(0.0, "walk damping (0 = no walk)", label="Walk damping β", lo=0.0, hi=1.0)
    degree: int = knob(3, "walk steps per layer", label="Walk degree", lo=1, hi=64)
    query_window: int = knob(
        32,
        "decode: recent queries whose sketches estimate the current row",
        label="Decode query window",
        lo=1,
        hi=1 << 16,
    )
    seed: int = knob(
        0, "seed of the sketch's random signs and coordinates", label="Seed", lo=0, hi=2**31 - 1
    )
    decode_reselect: int = knob(
        0,
        "decode: re-select each layer's blocks every k tokens (1 = every token; 0 = only when a "
        "new key block starts; the selection is reused in between, and with k > 1 may cross "
        "key blocks, each new block joining the lists as the local window)",
        label="Decode re-select every",
        lo=0,
        hi=1 << 16,
    )
    decode_reselect_span: int = knob(
        512,
        "decode: also re-select at least every max(1, T // span) tokens, T the context length "
        "(0 = off): a kept selection costs most fidelity at short contexts, where re-selecting "
        "is cheap, so the re-selection cost per token stays flat as T grows",
        label="Decode re-select span",
        lo=0,
        hi=1 << 24,
    )
    decode_stagger: bool = knob(
        True,
        "decode: spread the layers' re-selections over the re-selection cadence instead of "
        "re-selecting every layer at the same token (same mean cost per token, no step that "
        "pays for all layers at once)",
        label="Stagger decode re-selections",
    )
    # Not a knob: one layer's density per selection group, set by the session from the model's
    # layer profile (engine/method/layer_profile.py) on the config it hands that layer; empty: `density`
    # for every group. `density` is then their mean.
    group_density: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense_layers", tuple(int(x) for x in self.dense_layers))
        try:
            gd = tuple(float(x) for x in self.group_density)
        except (TypeError, ValueError):
            raise ConfigError(
                f"group densities must be numbers, got {self.group_density!r}"
            ) from None
        object.__setattr__(self, "group_density", gd)
        self.validate()

    def validate(self) -> None:
        """Check every knob against its declaration; one line per problem, the first raised."""
        for f, k in knobs():
            check_value(f.name, k, getattr(self, f.name), f.type)
        qb = self.query_block
        if qb and qb & (qb - 1):
            raise ConfigError(f"query block must be 0 or a power of two, got {qb}")
        if not all(0.0 < x <= 1.0 for x in self.group_density):
            raise ConfigError(f"group densities must lie in (0, 1], got {list(self.group_density)}")

    @property
    def rates(self) -> float | tuple[float, ...]:
        """What a layer's selection spends: one density per group where the layer profile set
        them, else the target density."""
        return self.group_density or self.density

    @property
    def rows_per_list(self) -> int:
        """Query blocks that share one list: query_block / block_size with the layer budget,
        else 1 (a query block no longer than the block size is the block itself)."""
        if self.budget != "layer":
            return 1
        return max(self.query_block // self.block_size, 1)

    @property
    def method_spec(self):
        """The registry entry of this config's method (engine/method/methods)."""
        return methods.get(self.method)

    @property
    def estimator_spec(self) -> Estimator:
        """The registry entry of this config's estimator (engine/method/estimators)."""
        return estimators.get(self.estimator)

    @property
    def effective_beta(self) -> float:
        """Methods that switch the walk off (nowalk: the per-layer baseline) read beta as 0."""
        return self.beta if self.method_spec.walks else 0.0

    def at_depth(self, layer: float, n_layers: float) -> SketchWalkConfig:
        """This config for one of the model's n_layers layers: the sampled estimator where the
        layer lies within the first sampled_depth of the model (ids start at 0; a depth in
        [0, 1] with n_layers 1)."""
        if self.estimator == "sampled" or layer >= self.sampled_depth * n_layers:
            return self
        return self.with_(estimator="sampled")

    def for_estimate(self, recorded: bool) -> SketchWalkConfig:
        """The config a layer's sketch runs with: this one, or, when neither the method's scores
        nor a recorder read the block estimate (streaming, quest, xattention, oracle), the
        cheapest estimate (block means), so such a method's time does not include an estimate
        it never uses. Their selections are the same either way."""
        if recorded or self.method_spec.reads_sketch or self.estimator == "mean":
            return self
        return self.with_(estimator="mean", query_samples=0)

    def sparse_in(self, phase: str) -> bool:
        return self.method != "dense" and self.phases in (phase, "both")

    def is_dense_layer(self, layer: int) -> bool:
        return self.method == "dense" or layer in self.dense_layers

    def groups(self, n_kv_heads: int) -> int:
        """Selection groups per layer: one per KV head, or one for the whole layer."""
        return n_kv_heads if self.per_group else 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dense_layers"] = list(self.dense_layers)
        d.pop("group_density")  # per-layer state of a run, not one of its knobs
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SketchWalkConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**d)

    @classmethod
    def from_stored(cls, d: dict[str, Any]) -> SketchWalkConfig:
        """A config saved by any version: knobs added since then take the value that reproduces
        what that version did (LEGACY), not today's default."""
        return cls.from_dict({**LEGACY, **{k: v for k, v in d.items() if k != "extra"}})

    def with_(self, **changes: Any) -> SketchWalkConfig:
        return replace(self, **changes)


def knobs() -> list[tuple[Any, Knob]]:
    """(dataclass field, Knob) for every declared knob, in declaration order."""
    return [(f, f.metadata["knob"]) for f in fields(SketchWalkConfig) if "knob" in f.metadata]


def default_of(f: Any) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()


def check_value(name: str, k: Knob, value: Any, type_name: Any) -> None:
    """Raise ConfigError (one line) when `value` breaks the knob's declaration."""
    what = name.replace("_", " ")
    t = str(type_name)
    if t == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{what} must be true or false, got {value!r}")
        return
    if t == "str":
        allowed = k.allowed()
        if allowed and value not in allowed:
            raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
        return
    if t.startswith("tuple"):
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in value):
            raise ConfigError(f"{what} must be non-negative integers, got {list(value)}")
        return
    numeric = (int,) if t == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric):
        kind = "an integer" if t == "int" else "a number"
        raise ConfigError(f"{what} must be {kind}, got {value!r}")
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{what} must be a number, got nan")
    if k.power_of_two and (value < 1 or value & (value - 1)):
        raise ConfigError(f"{what} must be a positive power of two, got {value}")
    if k.lo is not None and (value <= k.lo if k.lo_open else value < k.lo):
        raise ConfigError(f"{what} must be {'>' if k.lo_open else '>='} {k.lo:g}, got {value}")
    if k.hi is not None and value > k.hi:
        raise ConfigError(f"{what} must be <= {k.hi:g}, got {value}")


# Knobs added after runs were first stored, with the value that reproduces the older behaviour.
LEGACY: dict[str, Any] = {
    "budget": "row",
    "sink_blocks": 0,
    "window_blocks": 0,
    "estimator": "mean",
    "query_block": 0,
    "query_samples": 0,
    "decode_reselect": 1,
    "decode_reselect_span": 0,
    "decode_stagger": False,
    "layer_profile": "uniform",
    "pool": "mean",
    "sampled_depth": 0.0,
    "score_dtype": "float32",
    "score_rank": 0,
}

# ---- presets: data next to the declaration ----------------------------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    # Every quality target of docs/quality.md met at 20% density on the default model (issue
    # #41: GPL-3 KL 0.014, perplexity +1.5%; Apache-2.0 0.042), at the best CPU speed measured
    # with them (prefill 1.33-1.58x of dense at 7k against the lean preset's 1.66-1.74x): 16-token key
    # blocks read by 64-query tiles, the sampled estimator in every layer with 8 queries a block
    # scored in the full sketch, no walk (it did not help on this model).
    "default": {},
    # Speed on a CPU before fidelity: 32-token key blocks (the kernel's calls twice as long),
    # the sampled estimator (4 queries a block, a fitted rank-24 basis) in the first 70% of the
    # layers and block means after; GPL-3 KL 0.032, perplexity +3.5%, Apache-2.0 0.086, fewer
    # pass keys than dense on prompts never tuned on.
    "lean": {
        "block_size": 32,
        "estimator": "mean",
        "sampled_depth": 0.7,
        "query_samples": 4,
        "score_rank": 24,
    },
    # Fidelity first: the defaults with every query scored, so a block's estimate is its exact
    # mass in the sketch (Apache-2.0 KL 0.038, as the exact-mass oracle's 0.038, against the
    # defaults' 0.042), for twice the defaults' estimator work. The walk does not help here
    # (0.043 with it).
    "fidelity": {"block_size": 16, "estimator": "sampled", "query_samples": 0, "score_rank": 0},
    # Speed first: 64-token blocks (the CPU kernel's calls stay long) and the block-mean
    # estimator; per-group lists and one budget per layer as in the default; decode re-selects
    # once per key block whatever the context length. No dense layers:
    # they cost ~1.2 s of a 7k prefill and, with block means, bought little (KL without them:
    # GPL-3 6k 0.093 -> 0.091, Apache-2.0 0.228 -> 0.229, MPL-2.0 0.134 -> 0.131, argparse.py
    # 0.123 -> 0.135; docs/quality.md).
    "fast": {
        "block_size": 64,
        "query_block": 0,
        "estimator": "mean",
        "query_samples": 0,
        "dense_layers": (),
        "decode_reselect_span": 0,  # decode keeps a selection for its whole 64-token key block
        "pool": "mean",  # one block-mean query per block, no tiles: only the heads would pool
        "sampled_depth": 0.0,
        "beta": 0.25,
    },
    # What a CUDA run starts from when no preset is named (device_preset): one list per 128
    # query rows, the Hopper table's tile at head dim 64, with 32-token key blocks the Triton
    # kernel gathers four to a 128-key step; the sampled estimator (one fused kernel) in every
    # layer. Quality does not depend on the device, so it was measured on the CPU (issue #41,
    # docs/quality.md): GPL-3 6k KL 0.032 at 0.2, where 64-token blocks gave 0.044 and 16-token
    # blocks 0.023.
    "gpu": {
        "block_size": 32,
        "query_block": 128,
        "estimator": "sampled",
        "query_samples": 4,
        "score_rank": 24,
    },
    # The published configuration (the paper's README defaults), with our explicit density.
    "paper": {
        "block_size": 64,
        "per_group": False,
        "budget": "row",
        "estimator": "mean",
        "query_block": 0,
        "query_samples": 0,
        "sink": 0.025,
        "sink_blocks": 0,
        "window": 0.05,
        "window_blocks": 0,
        "dense_tail_blocks": 4,
        "dense_layers": (0, 1),
        "decode_reselect": 1,
        "decode_reselect_span": 0,
        "decode_stagger": False,
        "layer_profile": "uniform",
        "pool": "mean",
        "sampled_depth": 0.0,
        "score_dtype": "float32",
        "score_rank": 0,
        "beta": 0.25,
    },
}


# What each preset is for, in the words the command line's and the app's help show.
PRESET_NOTES: dict[str, str] = {
    "default": "every quality target met at the best measured speed",
    "lean": "32-token blocks and a cheaper estimator: CPU speed first, about twice the KL",
    "fidelity": "the defaults with every query scored: closest to dense, twice the estimator",
    "fast": "64-token blocks and block means: speed first",
    "gpu": "128-query tiles over 32-token blocks, sampled everywhere: CUDA's default",
    "paper": "the published configuration",
}


def device_preset(device: object = None) -> str:
    """The preset a run starts from when none is named: "gpu" on a CUDA device (where the
    kernels want wide key tiles and the estimator runs as one fused kernel), else "default"."""
    return "gpu" if str(device or "cpu").startswith("cuda") else "default"


def presets_help() -> str:
    """One line naming every preset and what it is for."""
    return "; ".join(f"{name}: {PRESET_NOTES[name]}" for name in PRESETS)


def preset(name: str, **overrides: Any) -> SketchWalkConfig:
    """A named preset with some knobs changed; an unknown name is a one-line error."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return SketchWalkConfig(**{**PRESETS[name], **overrides})
