"""Our hashes equal imagehash's on the same pixels, and behave as hashes should."""

from __future__ import annotations

import io

import imagehash
import numpy as np
import pytest
from PIL import Image

from krea2.curate.decode import decode
from krea2.curate.hashes import (
    colorhash_bits,
    hamming,
    image_hashes,
    md5,
    pack_bits,
    phash_bits,
)


@pytest.mark.parametrize("hash_size", [8, 12])
def test_phash_equals_imagehash_on_real_photos(real_photos, hash_size):
    for name, data in real_photos.items():
        pixels = decode(data).pixels
        ours = phash_bits(pixels, hash_size)
        theirs = imagehash.phash(Image.fromarray(pixels), hash_size=hash_size).hash
        assert (ours == theirs).all(), name


def test_colorhash_equals_imagehash_on_real_photos(real_photos):
    for name, data in real_photos.items():
        pixels = decode(data).pixels
        ours = colorhash_bits(pixels, binbits=3)
        theirs = imagehash.colorhash(Image.fromarray(pixels), binbits=3).hash
        assert (ours == theirs).all(), name


def test_hash_bytes_match_imagehash_hex(real_photos):
    pixels = decode(real_photos["astronaut.png"]).pixels
    hashes = image_hashes(pixels)
    assert hashes["phash12"].hex() == str(imagehash.phash(Image.fromarray(pixels), 12))
    assert hashes["phash8"].hex() == str(imagehash.phash(Image.fromarray(pixels), 8))
    assert len(hashes["phash12"]) == 18 and len(hashes["colorhash"]) == 6


def test_reduced_scale_hash_stays_close_to_full_resolution_hash(real_photos):
    """The documented difference from hashing the full image: a few bits, not a new hash.

    Images with alpha are composited on white first, as our decode does; imagehash's own
    ``convert("RGB")`` drops alpha and hashes whatever colour hides under transparent pixels.
    """
    for name, data in real_photos.items():
        full = Image.open(io.BytesIO(data))
        if "A" in full.mode:
            full = Image.alpha_composite(
                Image.new("RGBA", full.size, "white"), full.convert("RGBA")
            )
        full = full.convert("RGB")
        ours = pack_bits(phash_bits(decode(data).pixels, 12))
        theirs = pack_bits(imagehash.phash(full, hash_size=12).hash)
        assert hamming(ours, theirs) <= 6, name  # of 144 bits


def test_distinct_photos_are_far_apart(real_photos):
    hashes = [image_hashes(decode(d).pixels)["phash12"] for d in real_photos.values()]
    dists = [hamming(a, b) for i, a in enumerate(hashes) for b in hashes[i + 1 :]]
    assert min(dists) > 30


def test_md5_is_of_the_bytes():
    assert md5(b"") == "d41d8cd98f00b204e9800998ecf8427e"


def test_hamming_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        hamming(b"\x00", b"\x00\x00")
    assert hamming(b"\x0f\x00", b"\x00\x01") == 5


def test_flat_images_hash_to_the_same_phash():
    """A known phash weakness (imagehash #134) that colorhash resolves."""
    red = np.full((64, 64, 3), (200, 20, 20), np.uint8)
    blue = np.full((64, 64, 3), (20, 20, 200), np.uint8)
    a, b = image_hashes(red), image_hashes(blue)
    assert a["phash12"] == b["phash12"]
    assert a["colorhash"] != b["colorhash"]
