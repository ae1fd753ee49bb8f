"""``specchat profiles``: every profile, where it is defined, what its first use downloads,
where it runs and its memory plan for cards; ``--json`` for scripts."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.errors import SettingError
from engine.text_safety import inert


def cmd_profiles(args: argparse.Namespace) -> int:
    from engine.load.availability import cuda_present, unavailable_reason
    from engine.config.models_file import load_profiles, user_models_file

    from engine.fetch.inventory import local_specs, to_download
    from engine.fetch.sources import missing_local
    from engine.load.loader import profile_device_choice
    from engine.model.card_plan import profile_card_plans

    profiles = load_profiles(args.models)
    cuda = cuda_present()
    rows = []
    for name in profiles.names():
        p = profiles.get(name)
        why_not = unavailable_reason(p, cuda=cuda)
        fetch = to_download(p)
        try:
            device, device_reason = profile_device_choice(p) if p.backend == "local" else (None, None)
        except SettingError as exc:  # SPECCHAT_DEVICE=cuda without a card: this profile cannot load
            device, device_reason, why_not = None, None, why_not or str(exc)
        cards = profile_card_plans(p)
        rows.append({
            "name": name,
            "default": name == profiles.default,
            "target": p.target.source,
            "target_quantization": p.target.quantization,
            "drafter": p.drafter,
            "draft": p.draft.source if p.draft else None,
            "draft_quantization": p.draft.quantization if p.draft else None,
            "source_file": str(p.source_file) if p.source_file else None,
            "description": p.description,
            "backend": p.backend,
            "url": p.server.root if p.server else None,  # a password in it shown as ***
            "available": why_not is None,
            "unavailable_reason": why_not,
            "to_download": list(fetch.sources),
            "missing_files": [str(path) for path in map(missing_local, local_specs(p)) if path is not None],
            "download_bytes": fetch.bytes,
            "download_words": fetch.words() if fetch.sources else None,
            "device": p.device,
            "runs_on": device.torch_device.type if device is not None else None,
            "runs_on_reason": device_reason,
            "card_plans": [c.to_dict() for c in cards] if cards is not None else None,
        })
    for name in sorted(set(profiles.invalid) - set(profiles.profiles)):
        rows.append({"name": name, "default": False, "invalid": True, "invalid_reason": profiles.invalid[name]})
    rows.sort(key=lambda r: r["name"])
    user_file = user_models_file()
    from engine.quant import cpu_kernel

    kernel = {"variant": cpu_kernel.variant(), "unavailable_reason": cpu_kernel.why_not(),
              "cpu_features": cpu_kernel.cpu_features()}
    if args.json:
        print(json.dumps({"default": profiles.default, "files": [str(f) for f in profiles.files],
                          "user_models_file": str(user_file), "cpu_kernel": kernel, "profiles": rows,
                          "notices": list(profiles.notices)}, indent=2))
        return 0
    # names, descriptions and paths come from files: shown, never obeyed (_show)
    for notice in profiles.notices:
        if notice not in profiles.invalid.values():  # those are listed with their profile below
            _show(f"specchat: notice: {notice}", file=sys.stderr)
    for r in rows:
        if r.get("invalid"):
            _show(f"! {r['name']:<18} invalid, left out: {r['invalid_reason']}")
            continue
        mark = "*" if r["default"] else " "
        draft = r["draft"] and f"{r['draft']} [{r['draft_quantization']}]" or r["drafter"]
        if r["backend"] == "server":
            _show(f"{mark} {r['name']:<18} server {r['url']} (model {r['target']})")
            _show(f"  {'':<18} draft  chosen by the server")
        else:
            _show(f"{mark} {r['name']:<18} target {r['target']} [{r['target_quantization']}]")
            _show(f"  {'':<18} draft  {draft}")
        if r["description"]:  # models.toml: "one line shown in the profile list"
            _show(f"  {'':<18} about  {r['description']}")
        _show(f"  {'':<18} from   {r['source_file']}")
        if r["to_download"]:
            # a hub id is downloaded by transformers from the Hugging Face hub, its size unknown here
            _show(f"  {'':<18} first use downloads {r['download_words']} ({len(r['to_download'])} model(s) "
                  "not in the cache yet)")
        for path in r["missing_files"]:
            _show(f"  {'':<18} missing: nothing at {path} (the profile's local source)")
        if r["unavailable_reason"]:
            _show(f"  {'':<18} unavailable here: {r['unavailable_reason']}")
        elif r["runs_on_reason"] and r["device"] == "any":
            _show(f"  {'':<18} runs here on the {r['runs_on']}: {r['runs_on_reason']}")
        for i, card in enumerate(r["card_plans"] or []):
            _show(f"  {'':<18} {'on a card' if i == 0 else '':<9} {card['line']}")
    features = " ".join(kernel["cpu_features"]) or "none reported"
    if kernel["variant"]:
        print(f"\nint4 on the CPU: specchat's {kernel['variant']} kernel (CPU flags: {features})")
    else:
        print(f"\nint4 on the CPU: torch's kernel ({kernel['unavailable_reason']}; CPU flags: {features})")
    folder = user_file.parent
    state = ("" if user_file.exists() or user_file.is_symlink() else
             f" (which cannot be: {folder} is a file, not a folder)" if folder.exists() and not folder.is_dir() else
             " (not created yet)")
    _show(f"\nYour own profiles go in {user_file}{state}; SPECCHAT_CONFIG_DIR moves it.")
    return 0


def _show(*parts: object, **kwargs: Any) -> None:
    """``print`` with the text made :func:`~engine.text_safety.inert`."""
    print(*(inert(str(p)) for p in parts), **kwargs)
