"""Stage 1, corpus: text from a source named in config -> a normalised JSONL dataset and its manifest.

Sources:
  stdlib -- the running interpreter's standard-library Python files, sorted by relative path (offline, everywhere);
  hub    -- `datasets.load_dataset(path, name, split=...)`, rendered as plain text or prompt/response pairs;
  local  -- text files (one document each) or JSONL files.

Record kinds (`hub.kind` / `local.kind`): `text`; `prompt_response` (one document from a format string);
`chat` (supervised fine-tuning: the record becomes a conversation, `messages` = [system?, user, assistant], kept
next to its plain text; the tokenize stage renders it with the tokenizer's chat template and trains on the
assistant's tokens only).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def render(record: dict, fmt: dict) -> str | dict:
    """One dataset record -> one document: its text, or for `chat` {"text", "messages"}."""
    kind = fmt.get("kind", "text")
    if kind == "chat":
        prompt, response = record[fmt.get("prompt_field", "query")], record[fmt.get("response_field", "response")]
        messages = ([{"role": "system", "content": fmt["system"]}] if fmt.get("system") else []) + [
            {"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return {"text": f"{prompt}\n\n{response}", "messages": messages}
    if kind == "prompt_response":
        template = fmt.get("template", "### Question:\n{prompt}\n\n### Answer:\n{response}")
        return template.format(prompt=record[fmt.get("prompt_field", "query")],
                               response=record[fmt.get("response_field", "response")])
    return record[fmt.get("text_field", "text")]


def stdlib_documents(root: str | None = None) -> Iterator[tuple[str, str]]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    for path in files:
        try:
            yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def hub_documents(cfg: dict) -> Iterator[tuple[str, str]]:
    from datasets import load_dataset

    kwargs = {k: cfg[k] for k in ("name", "data_files", "revision") if cfg.get(k)}
    ds = load_dataset(cfg["path"], split=cfg.get("split", "train"), **kwargs)
    for i, record in enumerate(ds):
        yield f"{cfg['path']}[{i}]", render(record, cfg)


def local_documents(cfg: dict, base: str = ".") -> Iterator[tuple[str, str]]:
    paths = []
    for pattern in cfg["paths"]:
        matches = sorted(glob.glob(os.path.join(base, pattern)))
        if not matches:
            raise FileNotFoundError(f"corpus.local.paths: no file matches {pattern!r}")
        paths += matches
    for path in paths:
        if path.endswith((".jsonl", ".json")) or cfg.get("kind") in ("prompt_response", "chat"):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if line.strip():
                        yield f"{path}:{i + 1}", render(json.loads(line), cfg)
        else:
            yield path, Path(path).read_text(encoding="utf-8")


def documents(cfg: dict) -> Iterable[tuple[str, str]]:
    source = cfg["source"]
    if source == "stdlib":
        return stdlib_documents(cfg.get("stdlib_root"))
    if source == "hub":
        return hub_documents(cfg["hub"])
    if source == "local":
        return local_documents(cfg["local"])
    raise ValueError(f"corpus.source: unknown source {source!r} (stdlib, hub, local)")


def describe_source(cfg: dict) -> dict:
    source = cfg["source"]
    if source == "stdlib":
        return {"source": "stdlib", "root": cfg.get("stdlib_root") or sysconfig.get_paths()["stdlib"],
                "python": sysconfig.get_python_version()}
    return {"source": source, **cfg[source]}


def build_corpus(cfg: dict, out_jsonl: str, out_manifest: str) -> dict:
    """Write the normalised documents (capped by max_bytes / max_documents) and return the manifest."""
    max_bytes = cfg.get("max_bytes") or float("inf")
    max_docs = cfg.get("max_documents") or float("inf")
    digest, n_docs, n_bytes = hashlib.sha256(), 0, 0
    Path(out_jsonl).parent.mkdir(parents=True, exist_ok=True)
    with open(out_jsonl, "w", encoding="utf-8") as out:
        for doc_id, doc in documents(cfg):
            record = dict(doc) if isinstance(doc, dict) else {"text": doc}
            text = record["text"] = normalise(record["text"] or "")
            if not text:
                continue
            for message in record.get("messages", []):
                message["content"] = normalise(message["content"])
            size = len(text.encode("utf-8"))
            if n_bytes + size > max_bytes and n_docs > 0:
                break
            line = json.dumps({"id": doc_id, **record}, ensure_ascii=False) + "\n"
            out.write(line)
            digest.update(line.encode("utf-8"))
            n_docs += 1
            n_bytes += size
            if n_docs >= max_docs:
                break
    if n_docs == 0:
        raise ValueError(f"corpus: source {cfg['source']!r} produced no documents")
    manifest = {**describe_source(cfg), "documents": n_docs, "bytes": n_bytes, "sha256": digest.hexdigest(),
                "max_bytes": cfg.get("max_bytes"), "max_documents": cfg.get("max_documents")}
    Path(out_manifest).write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def read_records(jsonl: str) -> Iterator[dict]:
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def read_texts(jsonl: str) -> Iterator[str]:
    for record in read_records(jsonl):
        yield record["text"]


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, help="the config's `corpus` section as JSON")
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--manifest", required=True)
    args = ap.parse_args(argv)
    print(json.dumps(build_corpus(json.loads(args.params), args.jsonl, args.manifest), indent=2))


if __name__ == "__main__":
    main()
