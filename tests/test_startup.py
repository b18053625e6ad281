"""A run's start-up loads what it needs, once: file digests read once per version of a file (and
a changed file always hashed again), generate()'s settings check remembered for settings that
passed, a CTranslate2 run with a cached conversion that neither builds the PyTorch model nor reads
every weight again, and each start-up step named in the metric file's time_breakdown."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import assert_ok, metrics_of, single
from seq2seq_eval.config import EMBEDDED_DATA, EMBEDDED_MODEL
from seq2seq_eval.errors import ConfigError
from seq2seq_eval.model import generate_check, identity


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SEQ2SEQ_EVAL_CACHE", str(root))
    return root


def _reads(monkeypatch) -> list[Path]:
    """The files whose bytes identity hashes from now on."""
    read: list[Path] = []
    update = identity._update

    def counting(h, path):
        read.append(Path(path))
        update(h, path)

    monkeypatch.setattr(identity, "_update", counting)
    return read


def _rewrite_keeping_size_and_mtime(path: Path) -> None:
    """One byte changed in place, the size and the modification time as they were: only the
    change time, which the system sets, tells the new version from the old."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_digest_is_read_once_per_version_of_a_file(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(identity, "SETTLED_NS", -10**18)  # every file counts as settled
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"first" * 1000)
    b.write_bytes(b"second")
    read = _reads(monkeypatch)
    both = identity.known_sha256(a, b)
    assert both == hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()
    assert identity.known_sha256(a) == identity.file_sha256(a)
    read.clear()
    assert identity.known_sha256(a, b) == both and identity.known_sha256(a) == identity.file_sha256(a)
    assert read == [a]  # file_sha256 above; known_sha256 read neither file again
    read.clear()
    _rewrite_keeping_size_and_mtime(a)
    changed = identity.known_sha256(a, b)
    assert changed != both and changed == hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()
    assert read == [a, b]


def test_a_file_written_just_before_it_is_read_is_hashed_again(tmp_path, cache, monkeypatch):
    """A write in the same clock tick as the one before could leave the same times: a digest is
    kept only for a file whose last change is older than identity.SETTLED_NS."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    read = _reads(monkeypatch)
    assert identity.known_sha256(f) == identity.known_sha256(f)
    assert read == [f, f]


def test_a_digest_cache_that_cannot_be_written_costs_only_the_hashing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SEQ2SEQ_EVAL_CACHE", str(blocker / "cache"))  # under a file: never a folder
    monkeypatch.setattr(identity, "SETTLED_NS", -10**18)
    f = tmp_path / "w.bin"
    f.write_bytes(b"y" * 10)
    assert identity.known_sha256(f) == identity.file_sha256(f)


def test_a_changed_checkpoint_gets_another_conversion_and_identity(tmp_path, cache, monkeypatch):
    """The conversion cache's key and the manifest's weights digest come from remembered digests;
    a checkpoint changed in place (its size and modification time kept) is another model to both."""
    pytest.importorskip("ctranslate2")
    from seq2seq_eval.engines.ct2_convert import conversion_key
    from seq2seq_eval.run.prepare import _model_identity

    monkeypatch.setattr(identity, "SETTLED_NS", -10**18)
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODEL, model)
    key, weights = conversion_key(str(model)), _model_identity(None, str(model))["weights_sha256"]
    assert weights == identity.file_sha256(model / "model.safetensors")
    read = _reads(monkeypatch)
    assert (conversion_key(str(model)), _model_identity(None, str(model))["weights_sha256"]) == (key, weights)
    assert read == []  # remembered: no file read again
    _rewrite_keeping_size_and_mtime(model / "model.safetensors")
    assert conversion_key(str(model)) != key
    assert _model_identity(None, str(model))["weights_sha256"] == identity.file_sha256(model / "model.safetensors") != weights


def test_a_converted_file_changed_since_its_check_is_found(tmp_path, cache, monkeypatch):
    """The conversion's own check (ct2_convert.damage) reads a remembered digest for a file it
    checked before, and the file's bytes again once it has changed."""
    from seq2seq_eval.engines import ct2_convert

    monkeypatch.setattr(identity, "SETTLED_NS", -10**18)
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "model.bin").write_bytes(bytes(range(256)) * 64)
    (entry / ct2_convert.COMPLETE).write_text(json.dumps({"files": ct2_convert._manifest_of(entry)}))
    assert ct2_convert.damage(entry) is None
    read = _reads(monkeypatch)
    assert ct2_convert.damage(entry) is None and read == []
    _rewrite_keeping_size_and_mtime(entry / "model.bin")
    assert ct2_convert.damage(entry) == "model.bin differs from the converted file (sha256)"


def test_settings_that_passed_generates_check_are_not_checked_again(cache, monkeypatch):
    from transformers import AutoConfig, GenerationConfig
    from transformers.generation.utils import GenerationMixin

    config = AutoConfig.from_pretrained(EMBEDDED_MODEL)
    good = GenerationConfig(num_beams=4, max_length=20, eos_token_id=1, pad_token_id=0)
    bad = GenerationConfig(do_sample=True, temperature=-1.0, eos_token_id=1, pad_token_id=0)
    for _ in range(2):  # a refusal is never remembered
        with pytest.raises(ConfigError, match="temperature"):
            generate_check.check_generate_settings(bad, config)
    generate_check.check_generate_settings(good, config)
    calls = []
    build = GenerationMixin._get_logits_processor
    monkeypatch.setattr(GenerationMixin, "_get_logits_processor", lambda *a, **k: calls.append(1) or build(*a, **k))
    generate_check.check_generate_settings(good, config)
    assert calls == []  # remembered
    generate_check.check_generate_settings(GenerationConfig(num_beams=2, max_length=20, eos_token_id=1, pad_token_id=0),
                                           config)
    assert calls == [1]  # other settings: checked
    with pytest.raises(ConfigError, match="temperature"):
        generate_check.check_generate_settings(bad, config)


# A run whose start-up must not build a PyTorch model nor read a weight file: a cached conversion
# and remembered digests give it everything. Files count as settled at once (identity.SETTLED_NS),
# so that the run before this one keeps the digests of the conversion it made a moment ago.
NO_TORCH_MODEL = textwrap.dedent("""
    import sys
    from seq2seq_eval.model import identity
    identity.SETTLED_NS = -10**18
    if sys.argv[1] == "strict":
        import transformers

        def refuse(*args, **kwargs):
            raise AssertionError("a PyTorch model was built")

        def no_read(h, path):
            raise AssertionError(f"{path} was read again")

        transformers.PreTrainedModel.__init__ = refuse
        identity._update = no_read
    from seq2seq_eval import pandas_probe
    pandas_probe.skip()  # as `python -m seq2seq_eval` does: the bytes counted are the tool's own
    from seq2seq_eval.cli import main
    code = main(sys.argv[2:])
    with open("/proc/self/io") as f:  # the bytes this process read through read() calls
        open(sys.argv[1] + ".rchar", "w").write(f.read().split()[1])
    raise SystemExit(code)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts the bytes read from Linux's /proc/self/io")
def test_a_cached_conversion_runs_without_the_pytorch_model(tmp_path):
    pytest.importorskip("ctranslate2")
    script = tmp_path / "run.py"
    script.write_text(NO_TORCH_MODEL)
    env = {"SEQ2SEQ_EVAL_CACHE": str(tmp_path / "cache")}
    flags = ["--engine", "ctranslate2", "--n_obs", "4", "--early_stopping", "true"]
    texts = []
    for n, mode in enumerate(("first", "again", "strict")):  # converts; remembers the digests; neither
        save = tmp_path / f"run{n}"
        assert_ok(single([mode, *flags, "--save_dir", str(save)], cwd=tmp_path, env=env, script=script))
        texts.append((save / "test_generations.txt").read_text())
    assert texts[0] == texts[1] == texts[2]
    # Its model file, read once by CTranslate2, and little besides: not the checkpoint's weights,
    # nor the model file again to check it (before: both, twice the checkpoint).
    (converted,) = [p for p in (tmp_path / "cache" / "ctranslate2").iterdir() if p.is_dir()]
    size = (converted / "model.bin").stat().st_size
    assert int((tmp_path / "strict.rchar").read_text()) < size + (EMBEDDED_MODEL / "model.safetensors").stat().st_size // 2
    steps = metrics_of(save)["throughput"]["time_breakdown"]["startup_steps"]
    assert {"imports", "model_config", "tokenizer_load", "settings_checks", "fingerprint", "examples", "tokenize",
            "plan", "run_checks", "conversion", "model_load"} <= set(steps), steps


def test_the_time_breakdown_names_each_startup_step(tmp_path):
    save = tmp_path / "out"
    assert_ok(single(["--n_obs", "2", "--save_dir", str(save), "--data_dir", str(EMBEDDED_DATA["translation"])],
                     cwd=tmp_path, env={"SEQ2SEQ_EVAL_CACHE": str(tmp_path / "cache")}))
    tb = metrics_of(save)["throughput"]["time_breakdown"]
    steps = tb["startup_steps"]
    assert {"imports", "device", "claim", "model_config", "tokenizer_load", "settings_checks",
                                       "fingerprint", "examples", "tokenize", "plan", "run_checks", "model_load", "engine_setup"} <= set(steps)
    assert "conversion" not in steps
    assert tb["model_load"] == steps["model_load"] < tb["startup"] < tb["total"]
    # The steps of the run itself add up to its start-up (before_run is the process's time before it).
    assert sum(v for k, v in steps.items() if k != "before_run") == pytest.approx(tb["startup"], rel=0.05, abs=0.05)
    assert tb["prepare"] == {k: steps[k] for k in tb["prepare"]}


AS_THE_TOOL_REPORTING_PANDAS = textwrap.dedent("""\
    import runpy, sys
    try:
        runpy.run_module("seq2seq_eval", run_name="__main__", alter_sys=True)
    finally:
        open("pandas_imported", "w").write(str("pandas" in sys.modules))
""")


def test_a_run_never_imports_pandas(tmp_path):
    """pyarrow would import pandas (0.2-0.3 CPU-s) at its first conversion of Python objects; the
    tool never hands it a pandas object, so its processes keep pandas out."""
    script = tmp_path / "as_tool.py"
    script.write_text(AS_THE_TOOL_REPORTING_PANDAS)
    save = tmp_path / "out"
    assert_ok(single(["--n_obs", "3", "--save_dir", str(save), "--num_return_sequences", "2"], cwd=tmp_path,
                     env={"SEQ2SEQ_EVAL_CACHE": str(tmp_path / "cache")}, script=script))
    assert (save / "pseudolabel_results.json").is_file()  # the merge's tables, takes and JSON were made
    assert (tmp_path / "pandas_imported").read_text() == "False"


def test_keeping_pandas_out_costs_no_import_of_pyarrow():
    """skip() only puts its finder in place: a command that never converts anything (--help,
    `select`) does not import pyarrow for it (a fresh interpreter: the fork server has pyarrow)."""
    code = ("import sys\nfrom seq2seq_eval import pandas_probe\npandas_probe.skip()\n"
            "print(sorted(m for m in ('pyarrow', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


PROBE = textwrap.dedent("""\
    import importlib.util, sys
    from seq2seq_eval import pandas_probe
    pandas_probe.skip()
    import numpy as np, pyarrow as pa, pyarrow.compute as pc
    pa.array(["x", None]); pa.array(np.arange(3)); pa.scalar(1.5); pa.array([1, 2]).to_numpy(); pc.equal(pa.array([1]), 1)
    assert "pandas" not in sys.modules
    assert importlib.util.find_spec("pandas") is not None  # installed, as availability checks see it
    try:
        import pandas
    except ImportError as e:
        assert "\\n" not in str(e) and "pandas_probe" in str(e), e
    else:
        raise AssertionError("pandas imported while kept out")
    from seq2seq_eval.inputs import hub  # the datasets library, which uses pandas, puts it back
    ds = hub.load_split(sys.argv[1], None, "train")
    assert ds["id"] == ["a", "b"], ds["id"]
    import pandas as pd
    assert isinstance(pa.array(pd.Series(pd.Categorical(["u", "v", "u"]))), pa.DictionaryArray)
    assert pa.Table.from_pandas(pd.DataFrame({"k": [1]})).num_rows == 1
    print("ok")
""")


def test_pandas_kept_out_is_importable_again_for_the_datasets_library(tmp_path):
    """While kept out, pandas is found but not imported, with a one-line reason; loading a dataset
    file brings it back, and pyarrow then sees pandas objects as pandas objects again."""
    pytest.importorskip("datasets")
    csv = tmp_path / "set.csv"
    csv.write_text("id,source,target\na,x,y\nb,z,w\n")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = single([str(csv)], cwd=tmp_path, env={"HF_DATASETS_CACHE": str(tmp_path / "hf")}, script=script)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
