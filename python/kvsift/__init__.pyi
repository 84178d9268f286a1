# Type stub of the kvsift package (python/kvsift: the extension kvsift._kvsift re-exported by
# __init__.py; py.typed marks the package as typed). python/tests/test_stub.py checks that every
# public name and method of the package appears here and nothing more. Arrays are anything NumPy
# or DLPack can describe (numpy.ndarray, torch.Tensor, ...); they are borrowed, never copied.
import os
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

ArrayLike = Any  # a NumPy array or any object with __dlpack__
Filter = Union[None, "IdBelow", "IdRange", "IdMask", "IdList"]
PathLike = Union[str, os.PathLike[str]]

__version__: str
#: The build of the extension in use: "avx512", "avx2", "sse2" (x86-64 baseline) or "baseline".
isa: str
INVALID_ID: int

class InvalidArgument(ValueError): ...
class DimensionMismatch(InvalidArgument): ...
class OutOfRange(InvalidArgument): ...
class NonFiniteValue(InvalidArgument): ...
class IoError(OSError): ...

class IdBelow:
    def __init__(self, prefix_len: int) -> None: ...
    @property
    def prefix_len(self) -> int: ...

class IdRange:
    def __init__(self, first: int, last: int) -> None: ...
    @property
    def first(self) -> int: ...
    @property
    def last(self) -> int: ...

class IdMask:
    def __init__(self, mask: ArrayLike) -> None: ...
    @property
    def mask(self) -> ArrayLike: ...
    def __len__(self) -> int: ...

class IdList:
    def __init__(self, ids: ArrayLike) -> None: ...
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    def __len__(self) -> int: ...

class SearchResult:
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def distance_computations(self) -> npt.NDArray[np.int64]: ...
    @property
    def hops(self) -> npt.NDArray[np.int64]: ...

class DiprResult:
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def best_score(self) -> float: ...
    @property
    def capped(self) -> bool: ...
    @property
    def distance_computations(self) -> int: ...
    @property
    def hops(self) -> int: ...

class BlockResult:
    @property
    def blocks(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def distance_computations(self) -> int: ...

class BuildStats:
    @property
    def knn_seconds(self) -> float: ...
    @property
    def projection_seconds(self) -> float: ...
    @property
    def connectivity_seconds(self) -> float: ...
    @property
    def total_seconds(self) -> float: ...

class FlatIndex:
    def __init__(self, keys: ArrayLike) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def dtype(self) -> Any: ...
    @property
    def keys(self) -> ArrayLike: ...
    def topk(
        self, queries: ArrayLike, k: int, *, filter: Filter = None, threads: int = 0
    ) -> SearchResult: ...
    def dipr(
        self,
        query: ArrayLike,
        beta: float,
        *,
        l0: int = 64,
        max_candidates: int = 0,
        seed_score: Optional[float] = None,
        filter: Filter = None,
        entries: Optional[ArrayLike] = None,
    ) -> DiprResult: ...

class DiprHeadsResult:
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def counts(self) -> npt.NDArray[np.int64]: ...
    @property
    def best_scores(self) -> npt.NDArray[np.float32]: ...
    @property
    def capped(self) -> npt.NDArray[np.bool_]: ...
    @property
    def distance_computations(self) -> npt.NDArray[np.int64]: ...

class RoarGraphIndex:
    def __init__(
        self,
        keys: ArrayLike,
        train_queries: ArrayLike,
        *,
        nq: int = 100,
        M: int = 35,
        L: int = 500,
        threads: int = 0,
        seed: int = 2024,
    ) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def dtype(self) -> Any: ...
    @property
    def keys(self) -> ArrayLike: ...
    @property
    def build_stats(self) -> BuildStats: ...
    @property
    def max_degree(self) -> int: ...
    @property
    def entry_point(self) -> int: ...
    @property
    def entry_points(self) -> Any: ...
    def adjacency(self, *, width: int = 0) -> Any: ...
    @property
    def key_fingerprint(self) -> int: ...
    def search(
        self,
        queries: ArrayLike,
        k: int,
        *,
        L: int = 100,
        filter: Filter = None,
        entries: Optional[ArrayLike] = None,
        threads: int = 0,
        degree_cap: int = 0,
    ) -> SearchResult: ...
    def dipr(
        self,
        query: ArrayLike,
        beta: float,
        *,
        l0: int = 64,
        max_candidates: int = 0,
        seed_score: Optional[float] = None,
        filter: Filter = None,
        entries: Optional[ArrayLike] = None,
        degree_cap: int = 0,
    ) -> DiprResult: ...
    def save(self, path: PathLike) -> None: ...
    @staticmethod
    def load(path: PathLike, keys: ArrayLike) -> RoarGraphIndex: ...
    def to_bytes(self) -> bytes: ...
    @staticmethod
    def from_bytes(
        data: bytes,
        keys: ArrayLike,
        *,
        build_stats: Optional[Tuple[float, float, float, float]] = None,
    ) -> RoarGraphIndex: ...
    def __getstate__(self) -> tuple: ...
    def __setstate__(self, state: tuple) -> None: ...

class InsertableGraphIndex:
    def __init__(
        self,
        keys: ArrayLike,
        train_queries: ArrayLike,
        *,
        nq: int = 100,
        M: int = 35,
        L: int = 500,
        threads: int = 0,
        insert_L: int = 48,
        query_neighbors: int = 4,
    ) -> None: ...
    @property
    def size(self) -> int: ...
    def insert(self, keys: ArrayLike) -> int: ...
    def search(
        self, queries: ArrayLike, k: int, *, L: int = 100, threads: int = 0
    ) -> SearchResult: ...

class BlockIndex:
    def __init__(self, keys: ArrayLike, block_size: int) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def summary_bytes(self) -> int: ...
    def tokens_of(self, block: int) -> Tuple[int, int]: ...
    def bounds(self, query: ArrayLike, block: int) -> Tuple[float, float]: ...
    def topk(self, query: ArrayLike, k: int, *, filter: Filter = None) -> BlockResult: ...
    def dipr(self, query: ArrayLike, beta: float, *, filter: Filter = None) -> BlockResult: ...
    def tokens(self, blocks: ArrayLike, *, filter: Filter = None) -> npt.NDArray[np.int64]: ...

class Plan:
    @property
    def index(self) -> str: ...
    @property
    def query(self) -> str: ...
    @property
    def filter_prefix(self) -> Optional[int]: ...
    @property
    def filter(self) -> Optional[IdBelow]: ...
    @property
    def params(self) -> dict[str, float]: ...
    @property
    def reasons(self) -> list[str]: ...
    @property
    def decided_by(self) -> str: ...
    @property
    def gpu_bytes(self) -> float: ...
    @property
    def name(self) -> str: ...
    def explain(self) -> str: ...

class Planner:
    def __init__(
        self,
        *,
        short_context: int = 4096,
        head_dim: int = 128,
        block_size: int = 64,
        k_blocks: int = 16,
        dipr_l0: int = 64,
        dipr_beta: float = 8.0,
    ) -> None: ...
    def plan(
        self,
        context: int,
        *,
        reused_prefix: int = 0,
        layer: int = 0,
        gpu_budget_bytes: float = 0.0,
        latency_budget_us: Optional[float] = None,
    ) -> Plan: ...
    def gpu_bytes(self, index: str, context: int) -> float: ...
    def parse_name(self, name: str) -> Optional[Tuple[str, str]]: ...
    @property
    def short_context(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def k_blocks(self) -> int: ...
    @property
    def dipr_l0(self) -> int: ...
    @property
    def dipr_beta(self) -> float: ...
    @property
    def rules(self) -> list[str]: ...
    def remove_rule(self, name: str) -> None: ...

class PlanStep:
    @property
    def o(self) -> npt.NDArray[np.float32]: ...
    @property
    def lse(self) -> float: ...
    @property
    def ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def everything(self) -> bool: ...
    @property
    def scanned(self) -> int: ...
    @property
    def capped(self) -> bool: ...
    @property
    def search_seconds(self) -> float: ...
    @property
    def attention_seconds(self) -> float: ...

def execute_plan(
    plan: Plan,
    q: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    *,
    context: int,
    kv_head: int = 0,
    window: Tuple[int, int] = (0, 0),
    flat: Optional[FlatIndex] = None,
    graph: Optional[RoarGraphIndex] = None,
    coarse: Optional[BlockIndex] = None,
    budget: int = 0,
    topk: int = 0,
    beam: int = 100,
    k_blocks: int = 16,
    beta: float = 1.0,
    l0: int = 64,
    max_candidates: int = 0,
    seed_from_window: bool = False,
    scale: float = 0.0,
) -> PlanStep: ...
def sample_gqa_queries(
    heads: Sequence[ArrayLike], ratio: float, seed: int = 7
) -> npt.NDArray[np.float32]: ...
def sparse_attention(
    q: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    tokens: ArrayLike,
    *,
    kv_head: int = 0,
    scale: float = 0.0,
    bias: Optional[ArrayLike] = None,
) -> Tuple[npt.NDArray[np.float32], float]: ...
def dense_attention(
    q: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    first: int,
    last: int,
    *,
    kv_head: int = 0,
    scale: float = 0.0,
    bias: Optional[ArrayLike] = None,
) -> Tuple[npt.NDArray[np.float32], float]: ...
def merge(
    o_a: ArrayLike, lse_a: float, o_b: ArrayLike, lse_b: float
) -> Tuple[npt.NDArray[np.float32], float]: ...
def merge_n(os: ArrayLike, lses: ArrayLike) -> Tuple[npt.NDArray[np.float32], float]: ...
def dense_attention_heads(
    q: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    first: int,
    last: int,
    *,
    scale: float = 0.0,
    threads: int = 1,
) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def sparse_attention_heads(
    q: ArrayLike,
    keys: ArrayLike,
    values: ArrayLike,
    tokens: ArrayLike,
    *,
    scale: float = 0.0,
    threads: int = 1,
) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def merge_states(
    o_a: ArrayLike, lse_a: ArrayLike, o_b: ArrayLike, lse_b: ArrayLike
) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def dipr_heads(
    indexes: Sequence[RoarGraphIndex],
    queries: ArrayLike,
    beta: float,
    *,
    l0: int = 64,
    max_candidates: int = 0,
    seed_scores: Optional[ArrayLike] = None,
    filter: Filter = None,
    entries: Optional[ArrayLike] = None,
    threads: int = 1,
    degree_cap: int = 0,
) -> DiprHeadsResult: ...
def search_heads(
    indexes: Sequence[Union[RoarGraphIndex, InsertableGraphIndex, FlatIndex]],
    queries: ArrayLike,
    k: int,
    *,
    L: int = 100,
    filter: Filter = None,
    threads: int = 1,
    degree_cap: int = 0,
) -> SearchResult: ...
