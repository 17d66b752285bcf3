"""torch's and Triton's source hashes kept between predictions (amem_alloc/predict/engine/
source_keys.py): a value kept for the same sources is what torch's key function then returns; a
value kept for other sources (a fingerprint that differs) or an unreadable file is computed anew."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
codecache = pytest.importorskip("torch._inductor.codecache")
if not hasattr(codecache.torch_key, "set"):
    pytest.skip("this torch's source keys cannot be set (before prefetchable_cache)", allow_module_level=True)

from amem_alloc.predict.engine import source_keys  # noqa: E402

KEYS = (codecache.torch_key, codecache.triton_key)


@pytest.fixture
def fresh_keys():
    """torch's key functions as in a new process, before and after the test."""
    real = [f() for f in KEYS]
    for f in KEYS:
        f.clear()
    source_keys.prime.cache_clear()
    yield real
    for f in KEYS:
        f.clear()
    source_keys.prime.cache_clear()


def test_the_first_prediction_keeps_torchs_own_values(tmp_path, fresh_keys):
    source_keys.prime(tmp_path)
    kept = json.loads((tmp_path / source_keys.FILE_NAME).read_text())
    assert bytes.fromhex(kept["torch_key"]["value"]) == fresh_keys[0]
    assert kept["triton_key"]["value"] == fresh_keys[1]
    assert codecache.torch_key() == fresh_keys[0]


def test_a_kept_value_is_what_torch_then_uses_without_reading_its_sources(tmp_path, fresh_keys):
    source_keys.prime(tmp_path)
    path = tmp_path / source_keys.FILE_NAME
    kept = json.loads(path.read_text())
    kept["torch_key"]["value"] = b"kept".hex()   # had torch hashed its sources, it would not be this
    path.write_text(json.dumps(kept))
    for f in KEYS:
        f.clear()
    source_keys.prime.cache_clear()
    source_keys.prime(tmp_path)
    assert codecache.torch_key() == b"kept"


def test_a_value_kept_for_other_sources_is_computed_again(tmp_path, fresh_keys):
    path = tmp_path / source_keys.FILE_NAME
    path.parent.mkdir()
    path.write_text(json.dumps({"torch_key": {"fingerprint": "torch as it was before", "value": b"old".hex()}}))
    source_keys.prime(tmp_path)
    assert codecache.torch_key() == fresh_keys[0]
    assert bytes.fromhex(json.loads(path.read_text())["torch_key"]["value"]) == fresh_keys[0]


def test_an_edited_module_changes_the_fingerprint(tmp_path):
    package = tmp_path / "lib"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "m.py").write_text("x = 1\n")
    (package / "data").mkdir()   # no __init__.py: not a package torch's walk reads
    before = source_keys._fingerprint("1.0", package)
    (package / "data" / "notes.py").write_text("ignored\n")
    assert source_keys._fingerprint("1.0", package) == before
    (package / "sub" / "m.py").write_text("x = 22\n")
    assert source_keys._fingerprint("1.0", package) != before
    assert source_keys._fingerprint("1.1", package) != source_keys._fingerprint("1.0", package)
    library = tmp_path / "libtriton.so"   # a file the hash reads beside the modules
    library.write_bytes(b"1")
    with_library = source_keys._fingerprint("1.0", package, [library])
    library.write_bytes(b"22")
    assert source_keys._fingerprint("1.0", package, [library]) != with_library


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"torch_key": {"fingerprint": 3}}'])
def test_an_unreadable_file_is_as_if_absent(tmp_path, fresh_keys, content):
    (tmp_path / source_keys.FILE_NAME).parent.mkdir()
    (tmp_path / source_keys.FILE_NAME).write_text(content)
    source_keys.prime(tmp_path)
    assert codecache.torch_key() == fresh_keys[0]
    assert json.loads((tmp_path / source_keys.FILE_NAME).read_text())["torch_key"]["value"] == fresh_keys[0].hex()
