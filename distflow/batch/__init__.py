"""The samples one rank holds, as every layer passes them: PackedBatch (packed, no per-sample messages) and
the Megatron workers' padded [B, S] view of it (to_padded / from_padded).

Bottom layer: it imports nothing of DistFlow, so workers, rewards and the data coordinator all can use it.
"""

from distflow.batch.packed import FieldSchema, PackedBatch
from distflow.batch.padding import from_padded, to_padded

__all__ = ["FieldSchema", "PackedBatch", "from_padded", "to_padded"]
