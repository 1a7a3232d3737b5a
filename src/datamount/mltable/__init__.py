"""MLTable: parse an MLTable folder, evaluate its paths to files, load it as a table.

Public API (the rest of the package is internal):

- `evaluate(mltable_location, workspace, store_factory) -> list[EvalFile]`
- `EvalFile` (location, size, etag, entry, eval_path, account, container, path, uri)
- `evaluate_table(...) -> (MLTable, list[EvalFile], eval MLTable text)`
- `eval_mltable_text(mltable, files) -> str`: the MLTable for the eval layout root
- `eval_relative_path(location, mltable_folder) -> str`
- `load(path_or_uri, workspace=None, store_factory=None) -> TabularMLTable`
  (`to_arrow_table()`, `to_pandas_dataframe()`)
- `parse_mltable(text, source) -> MLTable`, `MLTableError`
"""

from __future__ import annotations

from datamount.mltable.evaluate import StoreFactory, evaluate, evaluate_table, read_mltable
from datamount.mltable.layout import EvalFile, eval_mltable_text, eval_relative_path
from datamount.mltable.model import MLTable, MLTableError, parse_mltable

__all__ = [
    "EvalFile",
    "MLTable",
    "MLTableError",
    "StoreFactory",
    "eval_mltable_text",
    "eval_relative_path",
    "evaluate",
    "evaluate_table",
    "load",
    "parse_mltable",
    "read_mltable",
]


def __getattr__(name: str) -> object:
    # `load` pulls in pyarrow's readers and pandas: only when asked for.
    if name == "load":
        from datamount.mltable.tabular import load

        return load
    raise AttributeError(name)
