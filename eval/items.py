"""The prompts of an eval: task specs ("lm", "retrieval:kv", "file:PATH") turned into token items.

Task spec grammar (comma-separated on the command line):
- lm[:SOURCE]          offline long text (eval_texts.SOURCES; default gpl-3), chunked per length
- retrieval[:KIND]     synthetic retrieval (eval_retrieval.KINDS; default passkey and kv), per
                       length
- file:PATH            a user file: plain text is chunked like lm; a .jsonl file holds one
                       {"prompt": ..., "answer": ...} object per line, scored like retrieval
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sketchwalk.errors import SketchWalkError
from sketchwalk.eval import retrieval as eval_retrieval
from sketchwalk.eval import texts as eval_texts

TASK_KINDS = ("lm", "retrieval", "file")


@dataclass(frozen=True)
class Item:
    """One prompt: the unit a dense pass is run for once and every grid cell is compared on."""

    task: str  # lm | retrieval | file
    source: str  # gpl-3, passkey, kv, a file name, ...
    length: int  # nominal length (the bucket this item is reported under)
    label: str  # readable id: "gpl-3[0:2048]", "kv d=0.5 #0"
    ids: torch.Tensor  # [1, T] token ids
    answer: str | None = None  # items with an answer are scored by exact match after decoding


def parse_tasks(spec: str, check_files: bool = True) -> list[tuple[str, str | None]]:
    """'lm,retrieval:kv,file:x.txt' -> [('lm', None), ('retrieval', 'kv'), ('file', 'x.txt')].
    check_files=False (a job from the app): a file task's path is not looked at, so the
    refusal that follows says nothing about which paths exist on the worker's host."""
    out: list[tuple[str, str | None]] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        kind, _, arg = part.partition(":")
        kind = kind.strip().lower()
        if kind not in TASK_KINDS:
            raise SketchWalkError(
                f"unknown task {part!r}; use lm[:SOURCE], retrieval[:KIND] or file:PATH"
            )
        if kind == "lm" and arg and arg not in eval_texts.SOURCES:
            raise SketchWalkError(
                f"unknown text source {arg!r}; choose one of {', '.join(eval_texts.SOURCES)}"
            )
        if kind == "retrieval" and arg and arg not in eval_retrieval.KINDS:
            raise SketchWalkError(
                f"unknown retrieval kind {arg!r}; choose one of {', '.join(eval_retrieval.KINDS)}"
            )
        if kind == "file":
            if not arg:
                raise SketchWalkError("a file task needs a path: file:PATH")
            if check_files and not Path(arg).expanduser().is_file():
                raise SketchWalkError(f"prompt file {arg} does not exist or is not a file")
        out.append((kind, arg or None))
    if not out:
        raise SketchWalkError("no tasks given; use e.g. --tasks lm,retrieval")
    return out


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def lm_items(
    tokenizer, source: str, name: str, text: str, length: int, max_chunks: int | None, task: str
) -> list[Item]:
    ids = _encode(tokenizer, text)
    spans = eval_texts.chunk_spans(len(ids), length)[:max_chunks]
    return [
        Item(task, source, length, f"{name}[{s}:{e}]", torch.tensor([ids[s:e]])) for s, e in spans
    ]


def jsonl_items(tokenizer, path: Path, max_tokens: int) -> list[Item]:
    """Prompt/answer pairs of a .jsonl file; the bucket length is each prompt's token count."""
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise SketchWalkError(f"{path}:{n} is not valid JSON") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise SketchWalkError(f'{path}:{n} needs a "prompt" string (and an "answer")')
        if "answer" not in obj:
            raise SketchWalkError(f'{path}:{n} has no "answer"')
        ids = _encode(tokenizer, obj["prompt"])
        if len(ids) > max_tokens:
            raise SketchWalkError(
                f"{path}:{n} has {len(ids)} tokens, more than the model's limit {max_tokens}"
            )
        items.append(
            Item(
                "file",
                path.name,
                len(ids),
                f"{path.name}:{n}",
                torch.tensor([ids]),
                str(obj["answer"]),
            )
        )
    if not items:
        raise SketchWalkError(f"{path} holds no prompts")
    return items


def build_items(
    tokenizer,
    tasks: list[tuple[str, str | None]],
    lengths: tuple[int, ...],
    depths: tuple[float, ...] = eval_retrieval.DEFAULT_DEPTHS,
    per_depth: int = 1,
    seed: int = 0,
    max_chunks: int | None = None,
    max_tokens: int = 1 << 30,
) -> list[Item]:
    """Every item of every task, in task order, then length, then position."""
    items: list[Item] = []
    for kind, arg in tasks:
        if kind == "lm":
            source = arg or eval_texts.DEFAULT_SOURCE
            for length in lengths:
                for name, text in eval_texts.load_source(source):
                    items += lm_items(tokenizer, source, name, text, length, max_chunks, "lm")
        elif kind == "retrieval":
            kinds = (arg,) if arg else eval_retrieval.DEFAULT_KINDS
            for r in eval_retrieval.make_items(tokenizer, kinds, lengths, depths, per_depth, seed):
                label = f"{r.kind} d={r.depth:g} #{r.index}" + (f" {r.template}" * bool(r.template))
                ids = torch.tensor([_encode(tokenizer, r.prompt)])
                items.append(Item("retrieval", r.kind, r.length, label, ids, r.answer))
        else:
            path = Path(str(arg)).expanduser()
            if path.suffix == ".jsonl":
                items += jsonl_items(tokenizer, path, max_tokens)
            else:
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise SketchWalkError(f"cannot read prompt file {path}: {exc}") from None
                for length in lengths:
                    items += lm_items(
                        tokenizer, path.name, path.name, text, length, max_chunks, "file"
                    )
    return items
