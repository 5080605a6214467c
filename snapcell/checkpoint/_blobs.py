"""Content-addressed blobs: large out-of-band buffers stored once, referenced by hash from checkpoints.

A blob is a one-byte codec tag followed by the (maybe zstd-compressed) raw bytes of one buffer.
Its key is derived from the SHA-256 hash of the raw bytes, so the same data is stored once, no
matter how many checkpoints or sessions refer to it. The checkpoint's signature covers the list of
references (hash and size), and every blob is hashed again after decompression, before use.

A content address is trusted across sessions (the first writer of a name decides what every later reader of
it gets), so it must be collision-resistant: a worker that could make two contents share a name could plant one
under the name of data another session is about to store. SHA-256 runs at about 1.8 GB/s here (with the CPU's SHA
instructions; BLAKE2b at 0.9). Checkpoints written before used xxh3-128 names: a digest's length says which hash
named it, so they keep loading, and the host accepts new blobs under SHA-256 names only. xxh3 stays where nothing
trusts it: a process's own caches of what it already scanned or restored (`fast_digest`).
"""

from __future__ import annotations

import hashlib
import struct

import xxhash
import zstandard

from snapcell.errors import CheckpointCorrupt

__all__ = [
    "BLOB_PREFIX",
    "BLOB_THRESHOLD_BYTES",
    "CHUNK_BYTES",
    "DIGEST_BYTES",
    "LEGACY_DIGEST_BYTES",
    "HASH_ALGORITHM",
    "REFRESH_AFTER_S",
    "blob_key",
    "blob_raw_size",
    "decode_blob",
    "encode_blob",
    "fast_digest",
    "hash_buffer",
    "pack_blob_ref",
    "unpack_blob_ref",
]

HASH_ALGORITHM = "sha256"
# Bytes of a blob's name, by the hash that made it: SHA-256's today, xxh3-128's in older checkpoints.
DIGEST_BYTES = 32
LEGACY_DIGEST_BYTES = 16
BLOB_PREFIX = "blobs/"
# Buffers at least this large become blobs; smaller ones stay inside the checkpoint.
BLOB_THRESHOLD_BYTES = 256 * 1024
# Large buffers are cut into chunks of this size, each its own blob: changing 1% of a big array
# stores about 1% again, not the whole array.
CHUNK_BYTES = 4 * 1024 * 1024
# A dump that reuses a blob last written or refreshed longer ago than this refreshes it, so a
# lifecycle rule at ttl + 2 days never deletes a blob a live checkpoint still needs. A quarter of
# cleanup's one-day grace for unreferenced blobs leaves room for clocks that disagree by hours.
REFRESH_AFTER_S = 6 * 3600.0

_DIGEST_BYTES = 16
_CHUNK = struct.Struct(">I")
_RAW = 0
_ZSTD = 1
_SAMPLE_BYTES = 256 * 1024
_INCOMPRESSIBLE_RATIO = 0.9


def hash_buffer(data: bytes | bytearray | memoryview) -> bytes:
    """The content address of a buffer: its 32-byte SHA-256 digest."""
    return hashlib.sha256(data).digest()


def fast_digest(data: bytes | bytearray | memoryview) -> bytes:
    """A 16-byte digest for a process's own caches (what it scanned or restored): fast, not collision-resistant."""
    return xxhash.xxh3_128_digest(data)


def _names(raw: bytes | bytearray | memoryview, digest: bytes) -> bool:
    """True when ``digest`` is the name of ``raw`` under the hash its length says (SHA-256, or xxh3-128 of old)."""
    if len(digest) == DIGEST_BYTES:
        return hashlib.sha256(raw).digest() == digest
    if len(digest) == LEGACY_DIGEST_BYTES:
        return bool(xxhash.xxh3_128_digest(raw) == digest)
    return False


def blob_key(digest: bytes, namespace: str) -> str:
    """The store key of the blob with this content hash, in a signing key's namespace (`Keyring.blob_namespace`)."""
    text = digest.hex()
    return f"{BLOB_PREFIX}{namespace}/{text[:2]}/{text}"


def encode_blob(raw: bytes | bytearray | memoryview, level: int) -> bytes:
    """Compress a buffer for storage, or keep it raw when it does not compress (random floats)."""
    view = memoryview(raw).cast("B")
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    if len(view) > 2 * _SAMPLE_BYTES:
        middle = len(view) // 2
        sample = view[middle : middle + _SAMPLE_BYTES]
        if len(compressor.compress(sample)) > _INCOMPRESSIBLE_RATIO * len(sample):
            return bytes([_RAW]) + view
    compressed = compressor.compress(view)
    if len(compressed) > _INCOMPRESSIBLE_RATIO * len(view):
        return bytes([_RAW]) + view
    return bytes([_ZSTD]) + compressed


def pack_blob_ref(digests: list[bytes]) -> bytes:
    """A buffer's reference section: the chunk size, then each chunk's hash."""
    return _CHUNK.pack(CHUNK_BYTES) + b"".join(digests)


def unpack_blob_ref(data: bytes | memoryview, raw_size: int) -> list[bytes]:
    """The chunk hashes of a buffer's reference section.

    Raises:
        CheckpointCorrupt: The section does not describe a buffer of ``raw_size`` bytes in whole chunks.
    """
    view = memoryview(data)
    if len(view) < _CHUNK.size:
        raise CheckpointCorrupt("the checkpoint has a malformed blob reference")
    (chunk,) = _CHUNK.unpack_from(view)
    count = -(-raw_size // chunk) if chunk else -1
    body = view[_CHUNK.size :]
    if chunk != CHUNK_BYTES or (count == 0 and len(body)):
        raise CheckpointCorrupt("the checkpoint has a malformed blob reference")
    if count == 0:
        return []
    # Every chunk's name has one length: SHA-256's, or xxh3-128's in a checkpoint written before.
    size = len(body) // count if len(body) % count == 0 else -1
    if size not in (DIGEST_BYTES, LEGACY_DIGEST_BYTES):
        raise CheckpointCorrupt("the checkpoint has a malformed blob reference")
    return [bytes(body[i : i + size]) for i in range(0, len(body), size)]


def blob_raw_size(data: bytes | bytearray | memoryview) -> int:
    """The raw size a stored blob declares (its codec byte and zstd frame header), read without decoding; -1 if none."""
    view = memoryview(data)
    if len(view) < 1:
        return -1
    if view[0] == _RAW:
        return len(view) - 1
    if view[0] == _ZSTD and len(view) >= 5:
        try:
            return int(zstandard.frame_content_size(view[1:]))
        except zstandard.ZstdError:
            return -1
    return -1


def decode_blob(data: bytes | bytearray | memoryview, *, digest: bytes, into: memoryview) -> None:
    """Decode a stored blob into ``into`` (exactly its size) and check it is the one the checkpoint names.

    Raises:
        CheckpointCorrupt: The blob is malformed, has the wrong size, or its hash does not match.
    """
    view = memoryview(data)
    raw_size = len(into)
    if len(view) < 1:
        raise CheckpointCorrupt(f"blob {digest.hex()} is empty")
    codec, payload = view[0], view[1:]
    if codec == _RAW:
        if len(payload) != raw_size:
            raise CheckpointCorrupt(f"blob {digest.hex()} has {len(payload)} bytes, the checkpoint says {raw_size}")
        into[:] = payload
    elif codec == _ZSTD:
        declared = zstandard.frame_content_size(payload) if len(payload) >= 4 else -1
        if declared != raw_size:
            raise CheckpointCorrupt(f"blob {digest.hex()} declares {declared} bytes, the checkpoint says {raw_size}")
        filled = 0
        try:
            with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
                while filled < raw_size:
                    n = reader.readinto(into[filled:])
                    if not n:
                        break
                    filled += n
        except zstandard.ZstdError as exc:
            raise CheckpointCorrupt(f"blob {digest.hex()} does not decompress: {exc}") from exc
        if filled != raw_size:
            raise CheckpointCorrupt(f"blob {digest.hex()} decompresses to fewer bytes than declared")
    else:
        raise CheckpointCorrupt(f"blob {digest.hex()} has an unknown codec {codec}")
    if not _names(into, digest):
        raise CheckpointCorrupt(
            f"blob {digest.hex()} does not match its hash: it was altered or replaced; the checkpoint was not loaded"
        )
