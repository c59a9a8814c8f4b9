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
import sys
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
    missing = missing_fields(ds.column_names, cfg, "corpus.hub", "its records have") if ds.column_names else None
    if missing:
        raise CorpusError(f"corpus.hub: {cfg['path']}: {missing}")
    for i, record in enumerate(ds):
        yield f"{cfg['path']}[{i}]", render(record, cfg)


class CorpusError(ValueError):
    """Bad corpus input: one line per problem, each naming the file, the line (1-based) or byte offset (0-based) and
    the config key, all problems of all files together, raised before anything is written."""


class CorpusFileNotFound(CorpusError, FileNotFoundError):
    """A CorpusError where (among the problems) a pattern of corpus.local.paths matches no file."""


MAX_PROBLEMS_PER_FILE = 10
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "true/false", int: "a number",
               float: "a number", type(None): "null"}


def _json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _fields(fmt: dict) -> list[tuple[str, str]]:
    """The record fields a kind reads: (config key, field name)."""
    if fmt.get("kind", "text") in ("prompt_response", "chat"):
        return [("prompt_field", fmt.get("prompt_field", "query")),
                ("response_field", fmt.get("response_field", "response"))]
    return [("text_field", fmt.get("text_field", "text"))]


def missing_fields(keys, fmt: dict, section: str, has: str = "the record has") -> str | None:
    """`no field 'text' (the record has: prompt, response; corpus.local.text_field)`, or None if none is missing."""
    keys = list(keys)
    missing = [(key, field) for key, field in _fields(fmt) if field not in keys]
    if not missing:
        return None
    names = ", ".join(repr(field) for _, field in missing)
    config_keys = ", ".join(f"{section}.{key}" for key, _ in missing)
    shown = ", ".join(map(str, keys[:12])) + (f", ... ({len(keys)} fields)" if len(keys) > 12 else "")
    return (f"no field{'s' if len(missing) > 1 else ''} {names} ({f'{has}: {shown}' if keys else f'{has} no fields'}"
            f"; {config_keys})")


def record_problem(record, fmt: dict, section: str) -> str | None:
    """What keeps `render` from making a document of this parsed JSON line, or None."""
    if not isinstance(record, dict):
        return f"{_json_type(record)}, not a JSON object"
    missing = missing_fields(record, fmt, section)
    if missing:
        return missing
    kind = fmt.get("kind", "text")
    for key, field in _fields(fmt):
        value = record[field]
        if kind == "text":
            ok = value is None or isinstance(value, str)  # null: an empty record, dropped like ""
        elif kind == "prompt_response":
            ok = isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
        else:
            ok = isinstance(value, str)
        if not ok:
            want = "a string" if kind != "prompt_response" else "a string or a number"
            return f"field {field!r} is {_json_type(value)}, not {want} ({section}.{key})"
    return None


def _universal_lines(text: str) -> list[str]:
    """`text` split as a file opened in text mode reads it (universal newlines), without the newline."""
    pieces = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return pieces[:-1] if pieces[-1] == "" else pieces


def _is_records(path: str, cfg: dict) -> bool:
    return path.endswith((".jsonl", ".json")) or cfg.get("kind") in ("prompt_response", "chat")


def _record_documents(path: str, cfg: dict, problems: list) -> Iterator[tuple[str, str | dict]]:
    """The documents of one JSON Lines file (`path:line`, rendered record); what is wrong with it goes to
    `problems` as (line, what), and those lines make no document."""
    hint = " (a .json file is read as JSON Lines: one object per line)" if path.endswith(".json") else ""
    line_no, offset, records, documents_made = 0, 0, 0, 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                lines = _universal_lines(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                at = line_no + len(_universal_lines(raw[:e.start].decode("utf-8") + "x"))
                problems.append((at, f"not UTF-8 at byte offset {offset + e.start} (0x{raw[e.start]:02x})"))
                line_no += len(_universal_lines(raw.decode("utf-8", errors="replace")))
                offset += len(raw)
                continue
            offset += len(raw)
            for line in lines:
                line_no += 1
                if not line.strip():
                    continue
                records += 1
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    problems.append((line_no, f"not JSON ({e.msg}: column {e.colno}){hint}"))
                    hint = ""
                    continue
                problem = record_problem(record, cfg, "corpus.local")
                if problem:
                    problems.append((line_no, problem))
                    continue
                doc = render(record, cfg)
                documents_made += bool(normalise((doc["text"] if isinstance(doc, dict) else doc) or ""))
                yield f"{path}:{line_no}", doc
    if not problems and not documents_made:
        if offset == 0:
            problems.append((None, "is empty"))
        elif not records:
            problems.append((None, "is empty (blank lines only)"))
        elif cfg.get("kind", "text") == "text":
            field = cfg.get("text_field", "text")
            problems.append((None, f"is empty: all {records} records have an empty {field!r} "
                                   "(corpus.local.text_field)"))
        else:
            problems.append((None, f"is empty: all {records} records are empty"))


def _text_document(path: str, problems: list) -> Iterator[tuple[str, str]]:
    """One text file as one document (its text as a file opened in text mode reads it: universal newlines)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        problems.append((None, f"not UTF-8 at byte offset {e.start} (0x{data[e.start]:02x})"))
        return
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not normalise(text):
        problems.append((None, "is empty" + (" (whitespace only)" if data else "")))
        return
    yield path, text


def _problem_lines(name: str, found: list) -> list[str]:
    """(line, what) pairs of one file -> `corpus.local: <file> line N: <what>` lines, one per distinct problem
    (the lines with the same one named after it), at most MAX_PROBLEMS_PER_FILE."""
    groups: dict[str, list] = {}
    for line, what in found:
        groups.setdefault(what, []).append(line)
    out = []
    for what, lines in groups.items():
        where = f"{name} line {lines[0]}" if lines[0] is not None else name
        more = lines[1:]
        also = "" if not more else (f" (also line{'s' if len(more) > 1 else ''} " + ", ".join(map(str, more[:5]))
                                    + (f" and {len(more) - 5} more" if len(more) > 5 else "") + ")")
        out.append(f"corpus.local: {where}{'' if what.startswith('is ') else ':'} {what}{also}")
    if len(out) > MAX_PROBLEMS_PER_FILE:
        out = out[:MAX_PROBLEMS_PER_FILE] + [
            f"corpus.local: {name}: {len(out) - MAX_PROBLEMS_PER_FILE} more problems not shown"]
    return out


def _file_documents(path: str, cfg: dict, problems: list[str]) -> Iterator[tuple[str, str | dict]]:
    """One matched file's documents; its problems, one line each, go to `problems`."""
    found: list = []
    try:
        if os.path.isdir(path):
            found.append((None, "is a directory, not a file"))
        elif _is_records(path, cfg):
            yield from _record_documents(path, cfg, found)
        else:
            yield from _text_document(path, found)
    except OSError as e:
        found.append((None, f"cannot read it ({e.strerror or e})"))
    problems += _problem_lines(path[2:] if path.startswith("./") else path, found)


def raise_problems(problems: list[str], missing: bool = False, what: str = "the local corpus files") -> None:
    """All problems as one error: the problem itself, or a heading and one line each."""
    if not problems:
        return
    message = problems[0] if len(problems) == 1 else (
        f"corpus: {len(problems)} problems in {what}, nothing written:\n  " + "\n  ".join(problems))
    raise (CorpusFileNotFound if missing else CorpusError)(message)


def local_paths(cfg: dict, base: str = ".") -> tuple[list[str], list[str]]:
    """The files corpus.local.paths matches, in order (each pattern's matches sorted), and a line per pattern that
    matches nothing."""
    paths, problems = [], []
    if not cfg.get("paths"):
        problems.append("corpus.local.paths: empty, but corpus.source is local")
    for pattern in cfg.get("paths", []):
        matches = sorted(glob.glob(os.path.join(base, pattern)))
        if not matches:
            problems.append(f"corpus.local.paths: no file matches {pattern!r}")
        paths += matches
    return paths, problems


def check_local(cfg: dict, base: str = ".") -> list[str]:
    """Read every file corpus.local names as `local_documents` would, and raise all their problems as one
    CorpusError; the files, if none."""
    paths, problems = local_paths(cfg, base)
    missing = bool(problems)
    for path in paths:
        for _ in _file_documents(path, cfg, problems):
            pass
    raise_problems(problems, missing)
    return paths


def local_documents(cfg: dict, base: str = ".") -> Iterator[tuple[str, str | dict]]:
    """Text files (one document each) or JSON Lines (one per non-blank line, id `path:line`), checked first: every
    problem of every file is one CorpusError before the first document."""
    paths = check_local(cfg, base)

    def read():
        for path in paths:
            problems: list[str] = []
            yield from _file_documents(path, cfg, problems)
            raise_problems(problems)  # a file changed since the check

    return read()


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
    docs = documents(cfg)  # local files: checked here, every problem in one CorpusError before anything is written
    Path(out_jsonl).parent.mkdir(parents=True, exist_ok=True)
    with open(out_jsonl, "w", encoding="utf-8") as out:
        for doc_id, doc in docs:
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
    try:
        manifest = build_corpus(json.loads(args.params), args.jsonl, args.manifest)
    except CorpusError as exc:  # bad input: the problems, one line each, without a traceback
        print(f"corpus failed (exit code 1): {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
