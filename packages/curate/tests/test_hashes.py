"""Our hashes equal imagehash's on the same pixels, and behave as hashes should."""

from __future__ import annotations

import io

import imagehash
import numpy as np
import pytest
import scipy.fftpack
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
from krea2.curate.shapes import Scene, ShapeObject, render, sample_scene


@pytest.mark.parametrize("hash_size", [8, 12])
def test_phash_equals_imagehash_on_real_photos(real_photos, hash_size):
    for name, data in real_photos.items():
        pixels = decode(data).pixels
        ours = phash_bits(pixels, hash_size)
        theirs = imagehash.phash(Image.fromarray(pixels), hash_size=hash_size).hash
        assert (ours == theirs).all(), name


def _imagehash_cases() -> dict[str, np.ndarray]:
    """ShapesWorld scenes (one centred shape: mirror-symmetric), flat and symmetric images:
    where scipy's DCT has exact zeros and the median can be 0."""
    rng = np.random.default_rng(3)
    cases = {}
    for i in range(40):
        scene = sample_scene(
            rng, max_objects=1 + i % 3, word_prob=0.3, jitter=0.0 if i < 20 else 0.5
        )
        cases[f"shapes-{i}"] = render(scene, *[(256, 256), (256, 192), (171, 256)][i % 3])
    centred = Scene(objects=(ShapeObject("square", "red", cell=4),))
    cases["centred-square"] = render(centred, 256, 256)
    for level in (0, 57, 200, 255):
        cases[f"flat-{level}"] = np.full((64, 64, 3), level, np.uint8)
    mirrored = np.zeros((96, 96, 3), np.uint8)
    mirrored[20:76, 30:66] = (40, 200, 90)
    cases["mirrored"] = mirrored
    return cases


def _noise_bits(pixels: np.ndarray, hash_size: int) -> np.ndarray:
    """Bits of imagehash's phash that rounding decides: coefficients within 1e-12 of the
    image's sum from the median (mathematically equal to it; scipy leaves residue)."""
    side = 4 * hash_size
    small = np.asarray(Image.fromarray(pixels).convert("L").resize((side, side), Image.LANCZOS))
    small = small.astype(np.float64)
    c = scipy.fftpack.dct(scipy.fftpack.dct(small, axis=0), axis=1)[:hash_size, :hash_size]
    return np.abs(c - np.median(c)) <= 1e-12 * small.sum()


@pytest.mark.parametrize("hash_size", [8, 12])
def test_phash_equals_imagehash_on_scenes_flat_and_symmetric_images(hash_size):
    noisy = []
    for name, pixels in _imagehash_cases().items():
        ours = phash_bits(pixels, hash_size)
        theirs = imagehash.phash(Image.fromarray(pixels), hash_size=hash_size).hash
        noise = _noise_bits(pixels, hash_size)
        assert (ours == theirs)[~noise].all(), name
        if (ours != theirs).any():
            noisy.append(name)
    # Flat, centred and mirrored images equal imagehash's exactly (scipy's zeros are exact
    # there); a scene may differ only in bits that rounding decides in imagehash itself.
    assert not [n for n in noisy if not n.startswith("shapes-")], noisy
    assert len(noisy) <= 2, noisy


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


def test_pack_bits_equals_numpy_packbits_for_any_shape_and_length():
    rng = np.random.default_rng(5)
    for shape in [(0,), (7,), (8,), (12, 12), (14, 3), (2, 3, 5)]:
        bits = rng.random(shape) > 0.5
        assert pack_bits(bits) == np.packbits(bits.ravel()).tobytes(), shape
        assert pack_bits(bits.astype(np.uint8)) == pack_bits(bits), shape
