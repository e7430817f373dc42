"""Helpers with TransformerLens's names: :func:`get_act_name`."""

from __future__ import annotations

import re

from ._arrays import as_int

__all__ = ["get_act_name"]

_LAYER_TYPE_ALIAS = {
    "a": "attn",
    "m": "mlp",
    "b": "",
    "block": "",
    "blocks": "",
    "attention": "attn",
}
_ACT_NAME_ALIAS = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The full hook name of a shorthand, as TransformerLens's ``utils.get_act_name``.

    ``get_act_name("pattern", 3) == "blocks.3.attn.hook_pattern"``,
    ``get_act_name("resid_pre", 0) == "blocks.0.hook_resid_pre"``,
    ``get_act_name("scale", 1, "ln2") == "blocks.1.ln2.hook_scale"``,
    ``get_act_name("normalized") == "ln_final.hook_normalized"``; a full name is returned as is.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    match = re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)
    if match is not None:
        name, layer_s, layer_type = match.groups(0)  # type: ignore[assignment]
        layer = int(layer_s)
    elif layer is not None:
        layer = as_int(layer, "layer")
    name = _ACT_NAME_ALIAS.get(name, name)
    full = ""
    if layer is not None:
        full += f"blocks.{layer}."
    if name in ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores", "value_hidden"):
        layer_type = "attn"
    elif name in ("pre", "post", "mid", "pre_linear"):
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIAS:
        layer_type = _LAYER_TYPE_ALIAS[layer_type]
    if layer_type:
        full += f"{layer_type}."
    full += f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full
