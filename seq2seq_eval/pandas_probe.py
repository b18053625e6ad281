"""pyarrow's pandas probes, answered before pyarrow asks them.

pyarrow looks for pandas when it first converts Python objects (an array from a list, a scalar,
`to_numpy`), to tell a pandas object or pandas' missing values from the rest, and imports it to
find out: 0.2-0.3 CPU-seconds and about 45 MB (measured: 47) in every process of the tool, which never hands
pyarrow a pandas object. In the tool's own processes (`python -m seq2seq_eval`) `skip()` keeps
pandas out until `restore()`: pyarrow's Python-side probe is answered with "not installed" the
first time it asks (it remembers that) and its C++-side probe, which asks again at each conversion, is refused
each time by a finder that stays in `sys.meta_path`. `importlib.util.find_spec("pandas")` still
finds it (it is installed); only importing it is refused, in one line naming this module.
pyarrow's own pandas paths (Table.to_pandas) are not used by the tool. `restore()` is called
before handing control to a library that uses pandas (datasets). Library use (evaluate(), the
training callback) never calls `skip()`: the process is the user's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any


class _Refused(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        raise ModuleNotFoundError(f"{spec.name} is not imported in seq2seq_eval's own processes "
                                  "(seq2seq_eval/pandas_probe.py); call pandas_probe.restore() before using it",
                                  name=spec.name)

    def exec_module(self, module: Any) -> None:  # never reached: create_module raises
        raise AssertionError(module)


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "pandas" or name.startswith("pandas."):
            return importlib.machinery.ModuleSpec(name, _Refused())
        return None


_FINDER = _NoPandas()


def skip() -> None:
    """The finder in place; pyarrow is not imported here (a command that never needs it, such as
    --help or `select`, does not pay for it): its Python-side probe, whenever it first runs, is
    answered by the finder and remembers the answer."""
    if "pandas" in sys.modules or _FINDER in sys.meta_path:  # already paid for, or already kept out
        return
    sys.meta_path.insert(0, _FINDER)


def restore() -> None:
    """pandas importable again, and pyarrow told that it is there (it imports it)."""
    if _FINDER not in sys.meta_path:
        return
    sys.meta_path.remove(_FINDER)
    import pyarrow as pa

    try:
        pa.table({}).to_pandas()  # pyarrow's Python-side probe asks again when a pandas path is called
    except ImportError:  # not installed: the probe's first answer was right
        pass
