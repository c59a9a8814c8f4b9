"""Importers: a peer tool's training files (LLaMA-Factory train YAMLs, DeepSpeed JSONs, accelerate configs,
torchtitan TOMLs) as one study of this pipeline, every key mapped, recorded as a substitution, or refused
(docs/importing.md):

    python3 -m workflow_scripts.importers FILE... --out STUDY.yaml

One module per format (llamafactory, deepspeed_json, accelerate, torchtitan), the ledger of what became of each key
in common, the pairing of files into one study in assemble.
"""

from workflow_scripts.importers.assemble import import_files, text
from workflow_scripts.importers.common import ImportRefused

__all__ = ["ImportRefused", "import_files", "text"]
