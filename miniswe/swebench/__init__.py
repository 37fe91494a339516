"""SWE-bench: task lists by file or dataset name, and grading by the official harness's own rules.

    datasets.py  dataset names (verified, lite, ...) and Hugging Face ids, Parquet files, the shipped
                 benchmark config (config/swebench.yaml) applied to SWE-bench task lists
    grading.py   one submitted patch graded in a fresh container from the instance's image, with the
                 harness's test spec, log parser and report (the `swebench` package, an optional extra)

`miniswe evaluate RUN_DIR` (grade, or regrade, a finished batch the same way) is batch/evaluate.py.

The optional packages are imported only when used: a batch of plain tasks never loads them.
"""

from __future__ import annotations

import importlib
import os

from miniswe.errors import UsageError

INSTALL = "pip install -e '.[swebench]' in the miniswe checkout"


def require(module: str, purpose: str):
    """The optional `module`, or one UsageError line naming what needs it and how to install it."""
    # the harness loads a .env from the current folder into this process at import: its variables would reach
    # the commands of local tasks, and unmasked, since the run's secrets were read before
    before = os.environ.get("PYTHON_DOTENV_DISABLED")
    os.environ["PYTHON_DOTENV_DISABLED"] = "1"
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name and error.name.split(".")[0] != module.split(".")[0]:
            raise UsageError(f"{purpose} needs {module}, which failed to import ({error}); reinstall it: {INSTALL}") from None
        raise UsageError(f"{purpose} needs the {module.split('.')[0]} package: {INSTALL}") from None
    finally:
        if before is None:
            os.environ.pop("PYTHON_DOTENV_DISABLED", None)
        else:
            os.environ["PYTHON_DOTENV_DISABLED"] = before
