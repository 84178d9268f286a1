"""kvsift: retrieval-based sparse attention (RoarGraph / flat indexes, top-k, DIPR and filtered
search, sparse attention with log-sum-exp merge) over NumPy arrays and DLPack tensors.

The compiled extension is ``kvsift._kvsift``; everything public is re-exported here, so
``import kvsift as ks; ks.RoarGraphIndex(...)`` is the whole API. ``kvsift.transformers``
(imported on demand: it needs torch and transformers) plugs it into Hugging Face models.
"""

from . import _kvsift
from ._kvsift import *  # noqa: F401,F403  (the extension's public names)
from ._kvsift import __version__  # noqa: F401

__doc__ = _kvsift.__doc__

# Classes and exceptions report (and pickle under) the public path, kvsift.X, as they did when
# the extension itself was the top-level module: pickles made before the package split load,
# and new pickles do not depend on where the extension sits inside the package.
for _name in dir(_kvsift):
    _obj = getattr(_kvsift, _name)
    if isinstance(_obj, type) and _obj.__module__ == _kvsift.__name__:
        _obj.__module__ = __name__
del _name, _obj
