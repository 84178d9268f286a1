"""kvsift: retrieval-based sparse attention (RoarGraph / flat indexes, top-k, DIPR and filtered
search, sparse attention with log-sum-exp merge) over NumPy arrays and DLPack tensors.

The compiled extension is ``kvsift._kvsift`` (on x86-64 also ``_kvsift_avx2`` and
``_kvsift_avx512``, the same code built for those instruction sets; the best one this CPU runs
is imported, or the one the environment variable ``KVSIFT_ISA`` = ``sse2`` | ``avx2`` |
``avx512`` names; ``kvsift.isa`` says which). Everything public is re-exported here, so
``import kvsift as ks; ks.RoarGraphIndex(...)`` is the whole API. ``kvsift.transformers``
(imported on demand: it needs torch and transformers) plugs it into Hugging Face models.
"""

import importlib as _importlib
import os as _os

from . import _isa

#: The build of the extension in use: "avx512", "avx2", or the baseline ("sse2" on x86-64,
#: "baseline" elsewhere).
isa = _isa.choose(_os.environ.get("KVSIFT_ISA"), _isa.cpu_features(__name__),
                  _isa.built(__name__))
# Bound as the package's _kvsift, so `from . import _kvsift` (kvsift.transformers) gets the
# module in use instead of importing the baseline build next to it (a second build in one
# process fails: pybind11 refuses to register a class twice).
_kvsift = _importlib.import_module(__name__ + "." + _isa.BUILDS[isa][0])
if isa == "sse2":
    isa = _isa.BASELINE

# The extension's public names (what `from ._kvsift import *` would bind, but without a second
# import: that statement looks up sys.modules["kvsift._kvsift"], the baseline build).
globals().update({_n: getattr(_kvsift, _n) for _n in dir(_kvsift) if not _n.startswith("_")})

__version__ = _kvsift.__version__
__doc__ = _kvsift.__doc__

# Classes and exceptions report (and pickle under) the public path, kvsift.X, as they did when
# the extension itself was the top-level module: pickles made before the package split load,
# pickles move between the ISA builds, and new pickles do not depend on where the extension
# sits inside the package.
for _name in dir(_kvsift):
    _obj = getattr(_kvsift, _name)
    if isinstance(_obj, type) and _obj.__module__ == _kvsift.__name__:
        _obj.__module__ = __name__
del _name, _obj
