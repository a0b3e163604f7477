"""The bucket manifest record (Pulsar keeps the bucket list in cursor properties; we keep one
protobuf `Manifest`). Written by the engine and by the offline seeder, read by recovery and verify.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .bitmap import LedgerBitmaps
from .codec import BucketRef, Manifest

# 2: seen-set and tombstones hold packed index ids (bitmap.pack), snapshots packed_index_bit_map;
# 1: index ids, snapshots index_id_bit_map. Recovery and verify read both; a format-1 reader
# refuses format 2 (so a downgrade stops instead of misreading the sets).
MANIFEST_FORMAT_VERSION = 2
PACKED_SETS_SINCE = 2


def bucket_ref(bucket_id: int, key: str, start_ledger: int, end_ledger: int, snapshot_length: int,
               index_count: int) -> "BucketRef":
    """The manifest's entry for one immutable bucket."""
    return BucketRef(bucket_id=bucket_id, bucket_key=key, start_ledger_id=start_ledger, end_ledger_id=end_ledger,
                     snapshot_length=snapshot_length, index_count=index_count)


def manifest_bytes(refs: Sequence["BucketRef"], *, seen: LedgerBitmaps, tombstones: LedgerBitmaps,
                   journal_cut: int, max_bucket_id: int, pending_delete: Iterable[int]) -> bytes:
    """Serialized Manifest: buckets in index order, the seen-set and tombstones as per-ledger
    portable RoaringBitmaps of packed index ids, the journal cut, the highest bucket id handed out, pending deletions."""
    return manifest_from_maps(refs, seen=seen.to_proto_map(), tombstones=tombstones.to_proto_map(),
                              journal_cut=journal_cut, max_bucket_id=max_bucket_id, pending_delete=pending_delete)


def manifest_from_maps(refs: Sequence["BucketRef"], *, seen: Mapping[int, bytes], tombstones: Mapping[int, bytes],
                       journal_cut: int, max_bucket_id: int, pending_delete: Iterable[int]) -> bytes:
    """manifest_bytes with the bitmaps already serialized (ledger -> portable bytes of packed
    index ids: LedgerBitmaps.to_proto_map)."""
    man = Manifest(
        format_version=MANIFEST_FORMAT_VERSION,
        buckets=list(refs),
        journal_cut=journal_cut,
        max_bucket_id=max([max_bucket_id] + [r.bucket_id for r in refs]),
        pending_delete=sorted(pending_delete),
    )
    for ledger, data in seen.items():
        man.seen[ledger] = data
    for ledger, data in tombstones.items():
        man.tombstones[ledger] = data
    return man.SerializeToString(deterministic=True)


def sets_are_packed(manifest: "Manifest") -> bool:
    """True when the manifest's seen-set and tombstones hold packed index ids (format 2 on)."""
    return manifest.format_version >= PACKED_SETS_SINCE
